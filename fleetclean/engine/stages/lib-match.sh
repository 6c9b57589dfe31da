# shellcheck shell=bash disable=SC2034,SC2154
# (argv and lo are fc_cmdline's locals: fc_identity runs inside it, bash scoping is dynamic.)
# fleetclean stage library: what a process *is*, the part of its command line a signal
# stage's pattern is matched against by default (match: identity). Rendered after lib.sh,
# before lib-kill.sh, into the scripts of playbooks that signal; during the scan of a stage
# that matches, fc_cmdline calls fc_identity for every process, on the words it has
# already read: no fork, no second read.
#
# The identity is, in order:
# - the process title, when the process set one: one string, NUL-padded by setproctitle
#   (which also sets comm to its first 15 bytes): sglang::scheduler_TP0, VLLM::Worker_TP3,
#   ray::IDLE, "postgres: checkpointer";
# - else the executable as written in argv (wrappers such as env, nohup, nice, timeout,
#   taskset, numactl, sudo skipped) and, for an interpreter, what it runs: the module
#   (python3 -m sglang.launch_server), the script (/usr/bin/python3 /opt/sglang/launch.py;
#   an installed entry point keeps its subcommand: /usr/bin/python3 /usr/local/bin/vllm
#   serve), the jar (java -jar x.jar) or main class, the first statement of -c/-e code;
#   interpreter options (-u, -X dev, -W ignore) are skipped. File arguments never count:
#   tail -f /root/logs/sglang_server.log is "tail", vim sglang.md is "vim".
# FC_IDENT[pid] holds it and FC_IDPART[pid] the part it is: title, executable, module,
# script or code.
# The stages that match set FC_WANT_IDENT=1 for their scan alone: the rescans of an
# escalation, the respawn watch and the report of what was left do without.
declare -gA FC_IDENT=() FC_IDPART=()
FC_WANT_IDENT=

# Options that take a value (the next word when not attached), per wrapper or interpreter;
# long ones in one list. Wrappers that take positionals before the command: timeout (the
# duration), taskset (the mask), chrt (the priority).
declare -gA FC_ID_WRAP_VALS=([env]=uCS [nice]=n [stdbuf]=ioe [timeout]=sk [taskset]=""
    [numactl]=CNmpi [chrt]=TPD [ionice]=cn [sudo]=ugCDhpRrTU [nohup]="" [setsid]="")
declare -gA FC_ID_WRAP_POS=([timeout]=1 [taskset]=1 [chrt]=1)
FC_ID_LONG_VALS=" --unset --chdir --split-string --adjustment --signal --kill-after
 --physcpubind --cpunodebind --membind --preferred --interleave --user --group --input
 --output --error --class --classdata --check-hash-based-pycs --require --import --loader
 --eval --print --classpath --class-path --module-path --add-modules --module --rcfile
 --init-file "

# Interpreters by name, version suffix dropped (python3.11 -> python, perl5.36 -> perl):
# their value-taking, code (-c, -e) and module (-m) option letters, "-" for none.
declare -gA FC_ID_INTERP=([python]="XWQ c m" [pypy]="XWQ c m" [bash]="oO c -" [sh]="oO c -"
    [dash]="oO c -" [zsh]="oO c -" [ksh]="oO c -" [mksh]="oO c -" [ash]="oO c -"
    [node]="r ep -" [nodejs]="r ep -" [perl]="IrCMm eE -" [ruby]="IrCMm eE -"
    [php]="cdz r -" [lua]="- e -" [luajit]="- e -" [Rscript]="- e -" [julia]="- e -"
    [tclsh]="- e -" [java]=java)

# fc_identity PID COMM PADDED: FC_IDENT[PID] and FC_IDPART[PID] from fc_cmdline's words
# (its argv, lo of them once the NUL padding is dropped; PADDED 1 when there was some). Most
# processes run a program that is neither a wrapper nor an interpreter: one lookup each,
# no copy of their words (a scan reads every process of the node).
fc_identity() {
    local pid=$1 a0=${argv[0]:-} base key
    ((lo)) || return 0  # a kernel thread, or a process in its exit: never matched
    if ((lo == 1)) && [[ $a0 != *" "* ]]; then
        FC_IDENT[$pid]=$a0 FC_IDPART[$pid]=executable
        if (($3)) || [[ $a0 == *:* ]]; then FC_IDPART[$pid]=title; fi
        return 0
    fi
    base=${a0##*/}
    key=${base%%[0-9]*}
    if ((lo > 1)) && [[ -z ${FC_ID_WRAP_VALS[${base:-_}]+set} && -z ${FC_ID_INTERP[${key:-_}]+set} ]]
    then
        FC_IDENT[$pid]=$a0 FC_IDPART[$pid]=executable
        return 0
    fi
    fc_ident_of "$2" "$3" "${argv[@]:0:lo}"
    FC_IDENT[$pid]=$REPLY FC_IDPART[$pid]=$FC_PART
}

# fc_ident_of COMM PADDED WORD...: the identity in REPLY, its part in FC_PART.
fc_ident_of() {
    local comm=$1 padded=$2 one first rest
    shift 2
    REPLY="" FC_PART=""
    (($#)) || return 0
    if (($# == 1)); then
        one=$1
        first=${one%% *}
        first=${first##*/}
        # One string with spaces is a title (sshd: root@notty, nginx: worker process), unless
        # it reads as a command line the program wrote about itself, first word its own name
        # (comm): then its words are what an argv would have been.
        if [[ $one != *" "* ]] || ((padded)) || [[ ${first:0:15} != "$comm" ]]; then
            REPLY=$one
            FC_PART=executable
            if ((padded)) || [[ $one == *[:\ ]* ]]; then FC_PART=title; fi
            return 0
        fi
        # Split by bash, unglobbed: a loop of ${rest#* } is quadratic in the title's length.
        local - IFS=' '
        set -f
        # shellcheck disable=SC2206
        local -a words=($one)
        fc_ident_words "${words[@]}"
        return 0
    fi
    fc_ident_words "$@"
}

# fc_ident_skip VALUE_LETTERS POSITIONALS: move i (of fc_ident_words) past the options,
# NAME=VALUE assignments and POSITIONALS leading words of a wrapper.
fc_ident_skip() {
    local vals=$1 pos=$2 a
    while ((i < n)); do
        a=${w[i]}
        if [[ $a == -- ]]; then
            i=$((i + 1))
            break
        elif [[ $a == [A-Za-z_]*=* && ${a%%=*} != *[!A-Za-z0-9_]* ]]; then
            i=$((i + 1))
        elif [[ $a == --?* ]]; then
            i=$((i + 1))
            [[ $a != *=* && $FC_ID_LONG_VALS == *[[:space:]]"$a"[[:space:]]* ]] && i=$((i + 1))
        elif [[ $a == -?* ]]; then
            i=$((i + 1))
            [[ ${#a} == 2 && -n $vals && $vals == *"${a:1:1}"* ]] && i=$((i + 1))
        else
            break
        fi
    done
    i=$((i + pos))
}

# fc_ident_words WORD...: an argv's identity (REPLY, FC_PART).
fc_ident_words() {
    local -a w=("$@")
    local i=0 n=$# base wrapper=0
    while ((i < n)); do
        base=${w[i]##*/}
        [[ -n ${FC_ID_WRAP_VALS[${base:-_}]+set} ]] || break
        wrapper=$i
        i=$((i + 1))
        fc_ident_skip "${FC_ID_WRAP_VALS[$base]}" "${FC_ID_WRAP_POS[$base]:-0}"
    done
    ((i < n)) || i=$wrapper  # a wrapper that runs nothing is itself
    local exe=${w[i]}
    base=${exe##*/}
    REPLY=$exe
    FC_PART=executable
    i=$((i + 1))
    local conf=${base%%[0-9]*}
    conf=${FC_ID_INTERP[${conf:-_}]:-}
    if [[ $conf == java ]]; then
        fc_ident_java
    elif [[ -n $conf ]]; then
        local vals=${conf%% *} codes=${conf#* } mods=${conf##* }
        codes=${codes%% *}
        fc_ident_run "${vals#-}" "${codes#-}" "${mods#-}"
    fi
}

# fc_ident_run VALUE_LETTERS CODE_LETTERS MODULE_LETTERS: an interpreter's options from
# w[i] on, then what it runs, appended to REPLY (the executable).
fc_ident_run() {
    local vals=$1 codes=$2 mods=$3 a k c code
    while ((i < n)); do
        a=${w[i]}
        i=$((i + 1))
        if [[ $a == -- ]]; then
            break
        elif [[ $a == --?* ]]; then
            case $a in
                --eval | --print) fc_ident_code "${w[i]:-}" "$a"; return 0 ;;
                --module) fc_ident_module "${w[i]:-}"; return 0 ;;
            esac
            [[ $a != *=* && $FC_ID_LONG_VALS == *[[:space:]]"$a"[[:space:]]* ]] && i=$((i + 1))
            continue
        elif [[ $a != -?* ]]; then
            i=$((i - 1))
            break
        fi
        # Short options, possibly bundled (-uB, -bc CMD, -Xdev, -mpkg.mod).
        for ((k = 1; k < ${#a}; k++)); do
            c=${a:k:1}
            if [[ -n $codes && $codes == *"$c"* ]]; then
                if ((k + 1 < ${#a})); then code=${a:k+1}; else code=${w[i]:-}; fi
                fc_ident_code "$code" "-$c"
                return 0
            elif [[ -n $mods && $mods == *"$c"* ]]; then
                if ((k + 1 < ${#a})); then fc_ident_module "${a:k+1}"; else fc_ident_module "${w[i]:-}"; fi
                return 0
            elif [[ -n $vals && $vals == *"$c"* ]]; then
                ((k + 1 < ${#a})) || i=$((i + 1))
                break
            fi
        done
    done
    ((i < n)) || return 0
    fc_ident_script "${w[i]}" "${w[i + 1]:-}"
}

# The script an interpreter runs; an installed entry point (no extension: sglang, vllm,
# ray, trtllm-serve) keeps its subcommand, a word such as serve or start.
fc_ident_script() {
    local script=$1 next=$2
    [[ $script == - ]] && return 0
    REPLY+=" $script"
    FC_PART=script
    if [[ ${script##*/} != *.* && $next == [a-z]* && $next != *[!a-z0-9_-]* ]]; then
        REPLY+=" $next"
    fi
}

fc_ident_module() {
    REPLY+=" -m $1"
    FC_PART=module
}

# -c/-e code (FLAG as given): for a shell, the identities of the commands it runs
# (sh -c "cd /opt && exec python3 -m sglang.launch_server" is "sh -c cd; python3 -m
# sglang.launch_server"; sh -c "tail -f sglang.log | grep x" is "sh -c tail; grep"); a
# reserved word before a command is not one (sh -c "while :; do python3 -m
# sglang.launch_server; sleep 1; done" is "sh -c :; python3 -m sglang.launch_server;
# sleep": the loop that runs a server again is matched as it, between two runs too), and
# a for or case clause's words are none. For another interpreter, the code's first
# statement.
fc_ident_code() {
    local code=$1 flag=$2 exe=$REPLY part out=""
    FC_PART=code
    case ${exe##*/} in
        bash | sh | dash | zsh | ksh | mksh | ash) ;;
        *)
            code=${code#"${code%%[![:space:]]*}"}
            code=${code%%[;$'\n']*}
            REPLY="$exe $flag ${code%"${code##*[![:space:]]}"}"
            return 0
            ;;
    esac
    # Cut into commands by bash's own split, unglobbed: a loop of ${code%%;*} and
    # ${code#*;} was quadratic in the code's length (a 1.5 KB `bash -c`, as launchers and
    # containers run, took 20 ms of every scan).
    local - IFS=';' base key
    set -f
    # shellcheck disable=SC2206
    local -a parts=(${code//[$'\t\n&|']/;})
    local plain=1
    [[ $code == *[\'\"\\#\`]* ]] && plain=0
    IFS=' '
    for part in "${parts[@]}"; do
        # shellcheck disable=SC2086
        set -- $part
        # Reserved words lead to the command they govern; done, fi, esac, } end nothing.
        # Only in code with no quote, backslash or comment: there the split above is the
        # shell's own, where in `echo "usage: while :; do python3 -m ..."` or `ssh gpu07
        # "while :; do python3 -m ...; done"` it cuts quoted text, whose words run nothing
        # here (before, the word after a cut read as the command "do", which matches no
        # server; so it still does).
        while ((plain && $#)); do
            case $1 in
                while | until | if | then | else | elif | do | '!' | '{') shift ;;
                time)
                    shift
                    [[ ${1:-} != -p ]] || shift
                    ;;
                for | case | select | done | fi | 'esac' | '}')
                    set --
                    break
                    ;;
                '('*)
                    set -- "${1#(}" "${@:2}"
                    [[ -n $1 ]] || shift
                    ;;
                *) break ;;
            esac
        done
        (($#)) || continue  # between the two & of a &&, or a reserved word alone
        # Most commands run a program as their first word that is neither a wrapper nor an
        # interpreter: itself (fc_ident_command's answer, without its call and word loop).
        base=${1##*/}
        key=${base%%[0-9]*}
        if [[ $1 != exec && $1 != *=* && $1 != [0-9\<\>]* &&
            -z ${FC_ID_WRAP_VALS[${base:-_}]+set} && -z ${FC_ID_INTERP[${key:-_}]+set} ]]; then
            out+="${out:+; }$1"
            continue
        fi
        fc_ident_command "$*" || continue
        out+="${out:+; }$REPLY"
    done
    REPLY="$exe $flag${out:+ $out}"
    FC_PART=code
}

# fc_ident_command TEXT: the identity of one simple shell command (leading exec, NAME=VALUE
# and redirections skipped); fails when there is none. Its words are split, not globbed.
fc_ident_command() {
    local word - IFS=' '
    local -a words=()
    set -f
    # shellcheck disable=SC2086
    for word in $1; do
        [[ $word == [0-9]'>'* || $word == [\<\>]* ]] && continue
        if ((${#words[@]} == 0)) && [[ $word == exec ||
            ($word == [A-Za-z_]*=* && ${word%%=*} != *[!A-Za-z0-9_]*) ]]; then
            continue
        fi
        words+=("$word")
    done
    ((${#words[@]})) || return 1
    fc_ident_words "${words[@]}"
}

# java: -jar FILE, -m/--module MODULE, or the main class after the options.
fc_ident_java() {
    local a
    while ((i < n)); do
        a=${w[i]}
        i=$((i + 1))
        case $a in
            -jar)
                REPLY+=" -jar ${w[i]:-}"
                FC_PART=script
                return 0
                ;;
            -m | --module) fc_ident_module "${w[i]:-}"; return 0 ;;
            -cp | -classpath | --class-path | -p | --module-path | --add-modules) i=$((i + 1)) ;;
            -*) ;;
            *)
                REPLY+=" $a"
                FC_PART=module
                return 0
                ;;
        esac
    done
}

# ---------------------------------------------------------------------------- relation
# scope: related (kill-workers in the built-in playbooks): a match is taken only when it
# belongs to the server. FC_REL_* remember what earlier stages targeted (signalled, or
# with --check would have): each (pid, starttime), the process groups and the sessions
# they led. Groups and sessions count only when led by a target: a login's session, or a
# script's process group, holds a person's other commands too.
declare -gA FC_REL_PID=() FC_REL_PGRP=() FC_REL_SID=() FC_RELWHY=()

fc_note_related() {
    local p
    for p in "$@"; do
        FC_REL_PID[$p]=${FC_START[$p]:-}
        [[ ${FC_PGRP[$p]:-} == "$p" ]] && FC_REL_PGRP[$p]=1
        [[ ${FC_SID[$p]:-} == "$p" ]] && FC_REL_SID[$p]=1
    done
}

# True (FC_RELWHY[PID] says why) when PID belongs to what an earlier stage targeted: it
# uses a GPU (a CUDA process with /dev/nvidiaN open), it or an ancestor was targeted, it is
# in a process group or session a target led, or it is a server's worker orphaned from
# its tree (fc_orphaned_worker).
fc_related() {
    local pid=$1 a=$1 hops=0
    if [[ -n ${FC_GF_CUDA[$pid]:-} && " ${FC_GF[*]} " == *" $pid "* ]]; then
        FC_RELWHY[$pid]="holds a GPU"
        return 0
    fi
    while [[ -n $a && $a != 0 && $a != 1 ]] && ((hops++ < 64)); do
        if [[ -n ${FC_REL_PID[$a]:-} && ${FC_REL_PID[$a]} == "${FC_START[$a]:-}" ]]; then
            FC_RELWHY[$pid]="in the tree of pid $a, stopped by an earlier stage"
            return 0
        fi
        a=${FC_PPID[$a]:-}
    done
    if [[ -n ${FC_REL_PGRP[${FC_PGRP[$pid]:-x}]:-} ]]; then
        FC_RELWHY[$pid]="in the process group of pid ${FC_PGRP[$pid]}, stopped by an earlier stage"
        return 0
    fi
    if [[ -n ${FC_REL_SID[${FC_SID[$pid]:-x}]:-} ]]; then
        FC_RELWHY[$pid]="in the session of pid ${FC_SID[$pid]}, stopped by an earlier stage"
        return 0
    fi
    fc_orphaned_worker "$pid"
}

# A worker reparented away from its server's tree (the server crashed or was killed alone;
# PID 1 or a subreaper adopted it): a titled process (sglang::scheduler_TP0) or a
# multiprocessing child (--multiprocessing-fork), in a process group that is neither its
# own nor its parent's and whose leader is gone. A child forked by its parent shares the
# parent's group; one that left it (setsid, setpgid) leads its own, as every command a
# person starts from a shell does: neither is taken for an orphan.
fc_orphaned_worker() {
    local pid=$1 g=${FC_PGRP[$1]:-0}
    [[ ${FC_IDPART[$pid]:-} == title || ${FC_CMD[$pid]} == *" --multiprocessing-fork"* ]] ||
        return 1
    ((g > 1)) && [[ $g != "$pid" && $g != "${FC_PGRP[${FC_PPID[$pid]:-x}]:-}" ]] || return 1
    [[ -z ${FC_START[$g]:-} ]] || return 1
    FC_RELWHY[$pid]="orphaned worker: its process group's leader (pid $g) is gone"
}

# fc_keep_related PID...: FC_HITS = the related ones; FC_SPARED = how many were not.
fc_keep_related() {
    local p
    local -a kept=()
    FC_SPARED=0
    FC_RELWHY=()
    (($#)) && fc_gpu_files
    for p in "$@"; do
        if fc_related "$p"; then kept+=("$p"); else FC_SPARED=$((FC_SPARED + 1)); fi
    done
    FC_HITS=("${kept[@]}")
}

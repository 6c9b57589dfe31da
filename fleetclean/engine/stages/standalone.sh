# shellcheck shell=bash disable=SC2034,SC2154
# (FC_BUNDLE_*, FC_EPILOG_* are assigned by the rendered script around this template.)
# Runtime of a script that no fleetclean controller runs (fleetclean export): a bundle that
# clush, pdsh or srun fans out, or Slurm's epilog. Records go to stdout as over SSH and,
# when a log is named, to that file too (slurmd throws an epilog's output away); fc_rec
# hands each one to fc_tap, which also judges the run as the controller would: the exit
# status is 0 clean, 1 dirty or faulty, 2 not cleaned or not judged (an error, a refusal, a
# run cut short), and one line says why, on stderr and in the log.

FC_T_LOG_FD=""

# Start judging (and logging to file $1, if not empty) a run about to begin.
fc_tap_begin() {
    local log=$1
    FC_T_HOST="" FC_T_VERIFY="" FC_T_VMSG="" FC_T_ERR="" FC_T_DONE=0 FC_T_HUNG=""
    FC_T_HELD=() FC_T_GPUS=()
    declare -gA FC_T_STAGE=()
    fc_now_us
    FC_T_START=$REPLY
    if [[ -n $log ]]; then
        # Records carry command lines: the log is for root's eyes only.
        if (umask 077 && mkdir -p -- "${log%/*}" && : >>"$log") 2>/dev/null &&
            exec {FC_T_LOG_FD}>>"$log"; then
            :
        else
            FC_T_LOG_FD=""
            printf 'fleetclean: cannot write %s; records on stdout only\n' "$log" >&2
        fi
    fi
    FC_TAP=1
}

# fc_tap LINE KIND FIELD...: log one record line, and keep what the verdict needs.
fc_tap() {
    [[ -z $FC_T_LOG_FD ]] || printf '%s\n' "$1" >&"$FC_T_LOG_FD"
    case $2 in
        begin) FC_T_HOST=$5 ;;
        stage) FC_T_STAGE[$3]=$4 ;;
        end) [[ $4 == failed && -z $FC_T_ERR ]] && FC_T_ERR="stage '${FC_T_STAGE[$3]:-$3}' failed: $9" ;;
        error) [[ -n $FC_T_ERR ]] || FC_T_ERR=$3 ;;
        # nvidia-smi did not answer (lib.sh: fc_smi_hung), or was not started: a scoped
        # run on a hung driver halts with this record alone.
        nvsmi) [[ $3 != 124 ]] || FC_T_HUNG=$4 ;;
        gpu) fc_tap_gpu "$3" ;;
        verify) FC_T_VERIFY=$3 FC_T_VMAX=$4 FC_T_VMSG=$6 ;;
        holder) ((${#FC_T_HELD[@]} < 3)) && FC_T_HELD+=("pid $3 ($5)") ;;
        "done") FC_T_DONE=1 ;;
    esac
}

# Keep "INDEX USED" of one nvidia-smi row (index, uuid, name, used, total).
fc_tap_gpu() {
    local used=${1%,*}
    used=${used##*,}
    FC_T_GPUS+=("${1%%,*} ${used//[[:space:]]/}")
}

# The verdict on the records seen: FC_JUDGED (the exit status) and FC_JUDGED_WHY.
fc_judge() {
    local held gpu busy=""
    if [[ $FC_T_HUNG == *"(state D)"* ]]; then
        # The driver is hung, as the controller says it (faulty): what else went wrong
        # follows from it.
        FC_JUDGED=1 FC_JUDGED_WHY="faulty: $FC_T_HUNG${FC_T_ERR:+; $FC_T_ERR}"
    elif [[ -n $FC_T_ERR || -n $FC_T_HUNG ]]; then
        FC_JUDGED=2 FC_JUDGED_WHY="error: ${FC_T_ERR:-$FC_T_HUNG}"
    elif ((!FC_T_DONE)); then
        FC_JUDGED=2 FC_JUDGED_WHY="error: the script stopped before its end"
    elif [[ $FC_T_VERIFY == dirty || $FC_T_VERIFY == faulty ]]; then
        for gpu in "${FC_T_GPUS[@]}"; do
            [[ ${gpu#* } =~ ^[0-9]+$ ]] && ((${gpu#* } > FC_T_VMAX)) && busy+="GPU${gpu% *} ${gpu#* } MiB, "
        done
        FC_JUDGED=1 FC_JUDGED_WHY="$FC_T_VERIFY: ${busy:+${busy%, } (}$FC_T_VMSG${busy:+)}"
        if ((${#FC_T_HELD[@]})); then
            printf -v held '%s, ' "${FC_T_HELD[@]}"
            FC_JUDGED_WHY+="; held by ${held%, }"
        fi
    elif [[ -n $FC_T_VERIFY && $FC_T_VERIFY != ok ]]; then
        FC_JUDGED=2 FC_JUDGED_WHY="error: $FC_T_VMSG"
    else
        FC_JUDGED=0 FC_JUDGED_WHY="clean"
    fi
}

# fc_standalone LOG FUNCTION: run FUNCTION (a rendered fc_main), judged and logged; its
# exit status is the verdict. The last record, "clock", says when it ran and the verdict
# (the controller never sees one: it times runs itself).
fc_standalone() {
    local log=$1 fn=$2 line end
    fc_tap_begin "$log"
    "$fn" </dev/null
    # fc_finish released what was held; explicitly, for the "clock" records below, one of
    # which is redirected to the log and must be written there, not kept for stdout.
    fc_release
    fc_judge
    FC_TAP=0
    fc_now_us
    end=$REPLY
    fc_rec clock "$FC_T_START" "$end" "$FC_JUDGED"
    line="fleetclean: ${FC_T_HOST:-$HOSTNAME}${FC_T_JOB:+ job $FC_T_JOB}: $FC_JUDGED_WHY"
    printf '%s\n' "$line" >&2
    if [[ -n $FC_T_LOG_FD ]]; then
        fc_rec clock "$FC_T_START" "$end" "$FC_JUDGED" >&"$FC_T_LOG_FD"
        printf '%s\n' "$line" >&"$FC_T_LOG_FD"
        exec {FC_T_LOG_FD}>&-
    fi
    return "$FC_JUDGED"
}

# A bundle (fleetclean export script): run the fc_main_N made for this host, found by its
# hostname (or FLEETCLEAN_HOST), full name first, then the short one.
fc_bundle_run() {
    local me=${FLEETCLEAN_HOST:-$HOSTNAME} key
    key=$me
    [[ -n ${FC_BUNDLE_FN[$key]:-} ]] || key=${me%%.*}
    if [[ -z ${FC_BUNDLE_FN[$key]:-} ]]; then
        fc_tap_begin ""
        fc_rec begin 1 "$FC_BUNDLE_PLAYBOOK" "$me" "$FC_BUNDLE_CHECK"
        fc_rec error "host $me is not in this bundle, which was made for $FC_BUNDLE_HOSTS (FLEETCLEAN_HOST=NAME picks one)"
        fc_rec "done" 0
        fc_judge
        FC_TAP=0
        printf 'fleetclean: %s: %s\n' "$me" "$FC_JUDGED_WHY" >&2
        return "$FC_JUDGED"
    fi
    FC_TARGET_HOST=${FC_BUNDLE_NAME[$key]}
    FC_TAP_JOURNAL=1  # lib.sh: the journal
    fc_standalone "" "fc_main_${FC_BUNDLE_FN[$key]}"
}

# Slurm's epilog (fleetclean export slurm-epilog): this node by slurmd's name for it, the
# finished job from slurmd's environment, records also to FC_EPILOG_LOG.
fc_epilog_run() {
    FC_TARGET_HOST=${SLURMD_NODENAME:-$HOSTNAME}
    FC_T_JOB=${SLURM_JOB_ID:-}
    # Its scope is that job: without its number, every job's processes were in it (a run
    # by hand on a shared node killed another job's). slurmd always sets it.
    if [[ ! $FC_T_JOB =~ ^[0-9]+$ ]]; then
        fc_standalone "$FC_EPILOG_LOG" fc_epilog_no_job
        return
    fi
    fc_standalone "$FC_EPILOG_LOG" fc_main
}

fc_epilog_no_job() {
    local is="not set"
    [[ -z ${SLURM_JOB_ID:-} ]] || is="not a job number: $SLURM_JOB_ID"
    fc_rec begin 1 slurm-epilog "$FC_TARGET_HOST" 0
    fc_rec error "SLURM_JOB_ID is $is, and an epilog scoped to no job would reach every job's processes: nothing was done (slurmd sets it; by hand, give SLURM_JOB_ID=N and SLURM_JOB_GPUS)"
    fc_rec "done" 0
}

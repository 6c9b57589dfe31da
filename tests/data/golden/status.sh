#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2317,SC2329
set +o posix
[[ -n ${FC_VQFD:-} && ${FC_VQFD@a} != *x* ]] || [[ -n ${FC_VGFD:-} && ${FC_VGFD@a} != *x* ]] || { unset FC_VQFD FC_VGFD FC_UVM; LC_ALL=C; [[ -e /run/fleetclean-smi-stuck || $EUID -gt 0 && (-O /tmp/fleetclean-lock-$EUID && -O /tmp/fleetclean-lock-$EUID/smi-stuck || -O ${XDG_RUNTIME_DIR:-/-}/fleetclean-lock && -O ${XDG_RUNTIME_DIR:-/-}/fleetclean-lock/smi-stuck) ]] || { read -r FC_UVM 2>/dev/null </sys/module/nvidia_uvm/refcnt; if [[ -n $FC_UVM || -e /sys/module/nvidia_uvm ]]; then :; elif [[ -d /sys/module/nvidia ]]; then FC_UVM=0; fi; if [[ $FC_UVM == [1-9]* || -z $FC_UVM ]]; then exec {FC_VQFD}< <(exec 2>/dev/null </dev/null; o=$(PATH=$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin nvidia-smi -q -d MEMORY,PIDS 2>&1); printf "%s\n@%d" "$o" "$?"); else exec {FC_VGFD}< <(exec 2>/dev/null </dev/null; o=$(PATH=$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total --format=csv,noheader,nounits 2>&1); printf "%s\n@%d" "$o" "$?"); fi; }; }
[[ -n ${FC_VXIDFD:-} && ${FC_VXIDFD@a} != *x* ]] || { unset FC_VXIDFD; LC_ALL=C; exec {FC_VXIDFD}< <(PATH=$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; read -r _ l _ 2>/dev/null </proc/sys/kernel/printk; if [[ $l == [0-5] ]] && dmesg -l emerg,alert,crit,err,warn,notice 2>/dev/null </dev/null; then :; elif command -v sed >/dev/null 2>&1; then dmesg 2>/dev/null </dev/null | sed -n '1{p;d;};/NVRM: Xid/p'; else dmesg 2>/dev/null </dev/null; fi); }
[[ -n ${BASH_SOURCE[0]:-}${BASH_EXECUTION_STRING:-} ]] || { set +p; unset TMOUT BASH_COMPAT; LC_ALL=C; unset FC_SRC; read -r -N 70113 FC_SRC; if ((${#FC_SRC} == 70113)); then eval "$FC_SRC"; else echo "fleetclean: the script arrived cut short, nothing was run (${#FC_SRC} of 70113 bytes)" >&2; false; fi; exit; }
# fleetclean 0.1.0: playbook status (built-in)
# host: "node01"  mode: check
# Runs as `bash -s` with this text on standard input (over SSH, fleetclean's own
# `bash -c` reads it whole first: transport/boot.py). Records go to stdout as
# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.
# The packaged bash comes without its comments: fleetclean/engine/stages has them.
# variables:
#   force = false
#   lock_wait = 5
#   max_used_mib = 0
#   never_stop_units = []
#   owner_docker = "stop"
#   owner_kubernetes = "refuse"
#   owner_plain = "signal"
#   owner_podman = "stop"
#   owner_screen = "signal"
#   owner_slurm = "refuse"
#   owner_systemd = "stop"
#   owner_tmux = "signal"
#   protect = []
#   smi_timeout = 30

# [lib.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [owner.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [verify.sh: packaged bash, pinned by tests/data/golden/templates.sha256]
fc_lazy() {
    local src text first size want='# fleetclean: definitions parsed at their first call (fc_lazy '"$1)" from
    if [[ ${FC_LAZY_DONE:-} != *"<$1>"* ]]; then
        FC_LAZY_DONE+="<$1>"
        for from in kept own file string; do
            src=
            case $from in
                kept) src=${FC_LAZY_SRC:-} ;;
                own) [[ ${FC_SRC@a} == *x* ]] || src=${FC_SRC:-} ;;
                file) [[ ! -f ${BASH_SOURCE[-1]:-} ]] ||
                    { IFS= read -r -d '' src <"${BASH_SOURCE[-1]}"; } 2>/dev/null ;;
                string) src=${BASH_EXECUTION_STRING:-} ;;
            esac
            text=${src%$'\n'}
            first=-1 size=0
            case $1 in
                1) first=$((${#text} - 40881)) size=24169 ;;
                2) first=$((${#text} - 16712)) size=16712 ;;
            esac
            if ((first >= 0)) && [[ ${text:first:${#want}} == "$want" ]]; then
                FC_LAZY_SRC=$src
                eval "${text:first:size}"
                return 0
            fi
        done
    fi
    fc_flush
    echo "fleetclean: $2 is not defined: the end of the script is missing or changed" >&2
    exit 3
}
unset FC_LAZY_DONE FC_LAZY_SRC

fc_main() {
    set +p; unset TMOUT BASH_COMPAT
    export LC_ALL=C
    PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    FC_PLAYBOOK=status
    FC_HOST=node01
    FC_CHECK=1
    FC_FORCE=0
    FC_LOCK_WAIT=5
    FC_SMI_TIMEOUT=30.000
    FC_PROTECT=(sshd sshd-session sshd-auth systemd init nvidia-persistenced nv-hostengine dcgm-exporter nv-fabricmanager Xorg)
    if ! fc_begin; then
        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"
        fc_finish
        return 0
    fi

    # verify: every GPU at or under max_used_mib before the deadline
    fc_reset_opts
    opt_max_used_mib=0
    opt_timeout_ms=0
    opt_interval_s=0.2
    opt_interval_ms=200
    opt_settle_ms=1000
    opt_leak_quiet_ms=1000
    fc_verify
    fc_finish
}

fc_main </dev/null
exit
# fleetclean: definitions parsed at their first call (fc_lazy 1)
# [40 functions, put back in their places]
# fleetclean: definitions parsed at their first call (fc_lazy 2)
# [39 functions, put back in their places]

#!/usr/bin/env bash
# shellcheck disable=SC2034
set +o posix
[[ -n ${BASH_SOURCE[0]:-}${BASH_EXECUTION_STRING:-} ]] || { set +p; unset TMOUT BASH_COMPAT; LC_ALL=C; unset FC_SRC; read -r -N 131292 FC_SRC; if ((${#FC_SRC} == 131292)); then eval "$FC_SRC"; else echo "fleetclean: the script arrived cut short, nothing was run (${#FC_SRC} of 131292 bytes)" >&2; false; fi; exit; }
# fleetclean 0.1.0: playbook free-gpus (built-in)
# host: "node01"  mode: run
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
#   ray_grace = 10
#   reset_leaked = "true"
#   sglang_grace = 10
#   smi_timeout = 30
#   tgi_grace = 15
#   triton_grace = 30
#   trtllm_grace = 15
#   verify_timeout = 30
#   vllm_grace = 15

# [lib.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-stage.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-match.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-kill.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [owner.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [owner-act.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [verify.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [signal.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [gpu-holders.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [gpu-reset.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

fc_main() {
    set +p; unset TMOUT BASH_COMPAT
    export LC_ALL=C
    PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    FC_PLAYBOOK=free-gpus
    FC_HOST=node01
    FC_CHECK=0
    FC_FORCE=0
    FC_LOCK_WAIT=5
    FC_SMI_TIMEOUT=30.000
    FC_PROTECT=(sshd sshd-session sshd-auth systemd init nvidia-persistenced nv-hostengine dcgm-exporter nv-fabricmanager Xorg)
    FC_OWNER_ACT=([systemd]=stop [docker]=stop [podman]=stop [kubernetes]=refuse [slurm]=refuse [tmux]=signal [screen]=signal [plain]=signal)
    FC_NEVER_STOP=()
    if ! fc_begin; then
        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"
        fc_finish
        return 0
    fi

    # stage 1/9: "stop-sglang" (signal)
    fc_reset_opts
    opt_pattern='sglang\.launch_server|(^|/)sglang serve( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 1 stop-sglang signal

    # stage 2/9: "stop-vllm" (signal)
    fc_reset_opts
    opt_pattern='vllm\.entrypoints\.|(^|/)vllm serve( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 2 stop-vllm signal

    # stage 3/9: "stop-trtllm" (signal)
    fc_reset_opts
    opt_pattern='(^|/)trtllm-serve( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 3 stop-trtllm signal

    # stage 4/9: "stop-triton" (signal)
    fc_reset_opts
    opt_pattern='(^|/)tritonserver( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=30000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 4 stop-triton signal

    # stage 5/9: "stop-tgi" (signal)
    fc_reset_opts
    opt_pattern='(^|/)text-generation-launcher( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 5 stop-tgi signal

    # stage 6/9: "stop-ray" (signal)
    fc_reset_opts
    opt_pattern='(^|/)ray start( |$)|/raylet/raylet( |$)|/gcs/gcs_server( |$)'
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 6 stop-ray signal

    # stage 7/9: "kill-workers" (signal)
    fc_reset_opts
    opt_pattern='^(sglang::|VLLM::|ray::)|(^|/)text-generation-server( |$)|mpi4py\.futures\.server'
    opt_scope=related
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 7 kill-workers signal

    # stage 8/9: "kill-gpu-holders" (gpu-holders)
    fc_reset_opts
    opt_filter=''
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 8 kill-gpu-holders gpu-holders

    # stage 9/9: "reset-leaked" (gpu-reset)
    fc_reset_opts
    opt_enabled=1
    opt_gpus=all
    opt_max_used_mib=0
    opt_quiet_ms=1000
    opt_wait_ms=10000
    fc_stage 9 reset-leaked gpu-reset

    # verify: every GPU at or under max_used_mib before the deadline
    fc_reset_opts
    opt_max_used_mib=0
    opt_timeout_ms=30000
    opt_interval_s=0.05
    opt_interval_ms=50
    opt_settle_ms=1000
    opt_leak_quiet_ms=1000
    fc_verify
    fc_finish
}

fc_main </dev/null

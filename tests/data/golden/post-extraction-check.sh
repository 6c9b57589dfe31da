#!/usr/bin/env bash
# shellcheck disable=SC2034
set +o posix
[[ -n ${BASH_SOURCE[0]:-}${BASH_EXECUTION_STRING:-} ]] || { set +p; unset TMOUT BASH_COMPAT; LC_ALL=C; unset FC_SRC; read -r -N 137976 FC_SRC; if ((${#FC_SRC} == 137976)); then eval "$FC_SRC"; else echo "fleetclean: the script arrived cut short, nothing was run (${#FC_SRC} of 137976 bytes)" >&2; false; fi; exit; }
# fleetclean 0.1.0: playbook post-extraction (built-in)
# host: "node01"  mode: check
# Runs as `bash -s` with this text on standard input (over SSH, fleetclean's own
# `bash -c` reads it whole first: transport/boot.py). Records go to stdout as
# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.
# The packaged bash comes without its comments: fleetclean/engine/stages has them.
# variables:
#   backup_suffix = ".bak_hsdump"
#   dump_dir = "/dev/shm/sglang_hs"
#   force = false
#   grace = 10
#   guard_path = "/dev/shm/sglang_hs"
#   lock_wait = 5
#   max_used_mib = 0
#   model_file = "/opt/sglang/models/deepseek_v2.py"
#   never_stop_units = []
#   owner_docker = "stop"
#   owner_kubernetes = "refuse"
#   owner_plain = "signal"
#   owner_podman = "stop"
#   owner_screen = "signal"
#   owner_slurm = "refuse"
#   owner_systemd = "stop"
#   owner_tmux = "signal"
#   protect = "jupyter"
#   reset_leaked = false
#   server_pattern = "sglang.launch_server"
#   smi_timeout = 30
#   verify_timeout = 30
#   worker_pattern = "sglang"

# [lib.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-stage.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-match.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [lib-kill.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [owner.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [owner-act.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [verify.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [guard.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [signal.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [gpu-holders.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [gpu-reset.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [restore.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

# [remove.sh: packaged bash, pinned by tests/data/golden/templates.sha256]

fc_main() {
    set +p; unset TMOUT BASH_COMPAT
    export LC_ALL=C
    PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    FC_PLAYBOOK=post-extraction
    FC_HOST=node01
    FC_CHECK=1
    FC_FORCE=0
    FC_LOCK_WAIT=5
    FC_SMI_TIMEOUT=30.000
    FC_PROTECT=(sshd sshd-session sshd-auth systemd init nvidia-persistenced nv-hostengine dcgm-exporter nv-fabricmanager Xorg jupyter)
    FC_OWNER_ACT=([systemd]=stop [docker]=stop [podman]=stop [kubernetes]=refuse [slurm]=refuse [tmux]=signal [screen]=signal [plain]=signal)
    FC_NEVER_STOP=()
    if ! fc_begin; then
        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"
        fc_finish
        return 0
    fi

    # stage 1/7: "guard-writers" (guard)
    fc_reset_opts
    opt_path=/dev/shm/sglang_hs
    opt_wait_for_file=''
    opt_wait_for_line=''
    opt_timeout_ms=0
    fc_stage 1 guard-writers guard

    # stage 2/7: "stop-server" (signal)
    fc_reset_opts
    opt_pattern=sglang.launch_server
    opt_scope=all
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 2 stop-server signal

    # stage 3/7: "kill-workers" (signal)
    fc_reset_opts
    opt_pattern=sglang
    opt_scope=related
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 3 kill-workers signal

    # stage 4/7: "kill-gpu-holders" (gpu-holders)
    fc_reset_opts
    opt_filter=''
    opt_match=identity
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 4 kill-gpu-holders gpu-holders

    # stage 5/7: "reset-leaked" (gpu-reset)
    fc_reset_opts
    opt_enabled=0
    opt_gpus=all
    opt_max_used_mib=0
    opt_quiet_ms=1000
    opt_wait_ms=10000
    fc_stage 5 reset-leaked gpu-reset

    # stage 6/7: "restore-model" (restore)
    fc_reset_opts
    opt_file=/opt/sglang/models/deepseek_v2.py
    opt_backup_suffix=.bak_hsdump
    fc_stage 6 restore-model restore

    # stage 7/7: "remove-dump" (remove)
    fc_reset_opts
    opt_paths=(/dev/shm/sglang_hs)
    opt_globs=(0)
    opt_missing_ok=1
    fc_stage 7 remove-dump remove

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

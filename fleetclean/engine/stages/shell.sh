# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "shell": run opt_command with bash, its variables in the environment (opt_env
# holds NAME VALUE pairs), stdout sent to stderr so it can never forge a record.
fc_stage_shell() {
    local rc i
    if ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would run: $opt_command"
        fc_rec change "$FC_IDX" "$FC_MESSAGE"
        return 0
    fi
    (
        for ((i = 0; i + 1 < ${#opt_env[@]}; i += 2)); do
            printf -v "${opt_env[i]}" '%s' "${opt_env[i + 1]}"
            export "${opt_env[i]?}"
        done
        # Neither the lock (9) nor the journal (lib.sh) outlives the script in a daemon
        # the command starts.
        [[ -z $FC_JOURNAL_FD ]] || exec {FC_JOURNAL_FD}>&-
        exec timeout -k 5 "$opt_timeout_s" bash -c "$opt_command"
    ) 9>&- </dev/null > >(fc_shell_relay) 2>&1
    rc=$?
    FC_MATCHED=1
    if ((rc == 0)); then
        FC_MESSAGE="exit status 0"
    elif ((rc == 124)); then
        FC_STATUS=failed
        FC_MESSAGE="timed out after ${opt_timeout_s}s"
    else
        FC_STATUS=failed
        FC_MESSAGE="exit status $rc"
    fi
}

# What the command writes (stdout and stderr alike) goes to the script's stderr through
# this relay, not straight there: a controller that goes away closes that stream, and the
# command's next write would kill it (SIGPIPE) halfway through, while the teardown goes on
# alone (lib.sh: the journal). The relay takes the broken pipe instead (SIGPIPE ignored
# here alone, never in the command) and reads on into /dev/null until the command and
# whatever it left running close their end. Neither the lock (9) nor the journal is held
# by it: a daemon the command starts may keep it for as long as it lives.
fc_shell_relay() {
    exec 9>&-
    [[ -z $FC_JOURNAL_FD ]] || exec {FC_JOURNAL_FD}>&-
    trap '' PIPE
    cat >&2 || exec cat >/dev/null
}

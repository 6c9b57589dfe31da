# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "signal": match processes by ERE on the full command line, take their tree
# (descendants, process groups and sessions they lead), signal, poll, escalate to KILL.
# Options: opt_pattern, opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).
fc_stage_signal() {
    local pattern=$opt_pattern
    fc_scan
    fc_match "$pattern" || { FC_STATUS=failed; return 0; }
    if ((opt_tree)); then
        fc_expand "${FC_HITS[@]}"
    else
        fc_keep_unprotected "${FC_HITS[@]}"
    fi
    fc_owner_records "${FC_TARGETS[@]}"
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "signal": match processes by ERE on their identity (or, match: cmdline, the full
# command line), keep with scope: related only the matches that belong to what earlier
# stages stopped (lib-match.sh), take their tree (descendants, process groups and sessions
# they lead), signal, poll, escalate to KILL.
# Options: opt_pattern, opt_match (identity|cmdline), opt_scope (all|related), opt_signal,
# opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).
fc_stage_signal() {
    local pattern=$opt_pattern
    FC_WANT_IDENT=1 fc_scan
    fc_match "$pattern" "" "$opt_match" || { FC_STATUS=failed; return 0; }
    FC_SPARED=0
    FC_RELWHY=()
    [[ $opt_scope == related ]] && fc_keep_related "${FC_HITS[@]}"
    fc_signal_hits "${FC_HITS[@]}"
    if ((FC_SPARED)); then
        FC_MESSAGE+="; $FC_SPARED match(es) left alone: not related to what earlier stages stopped"
    fi
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "toy" (tests only): write one "toy" record per repetition, opt_times of them.
# Options: opt_word, opt_times.
fc_stage_toy() {
    local i
    for ((i = 1; i <= opt_times; i++)); do
        fc_rec toy "$FC_IDX" "$i" "$opt_word"
    done
    FC_MATCHED=$opt_times
    FC_MESSAGE="said it $opt_times times"
}

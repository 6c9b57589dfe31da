# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Verification: poll nvidia-smi until every GPU uses at most opt_max_used_mib MiB or
# opt_timeout_ms pass; then report the GPU rows, the compute apps and the device-file
# holders as records. Any nvidia-smi failure is reported with its own message.
fc_verify() {
    local max=$opt_max_used_mib out rc t0 state line used n over unknown settled=0 left wait_s
    local respawn=""
    local no_number=""
    local -a rows=()
    fc_rec stage verify verify verify
    if ((FC_HALT)); then
        fc_rec verify skipped "$max" 0 "not run: $FC_HALT_REASON"
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        fc_rec nvsmi 127 "nvidia-smi: command not found"
        fc_rec verify error "$max" 0 "nvidia-smi: command not found"
        return 0
    fi
    fc_now_us
    t0=$REPLY
    while :; do
        out=$(nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total \
            --format=csv,noheader,nounits 2>&1)
        rc=$?
        if ((rc != 0)); then
            fc_rec nvsmi "$rc" "$out"
            fc_now_us
            fc_rec verify error "$max" "$(((REPLY - t0) / 1000))" "nvidia-smi exit $rc: $out"
            return 0
        fi
        rows=() n=0 over=0 unknown=0 no_number=""
        while IFS= read -r line; do
            [[ -n ${line//[[:space:]]/} ]] || continue
            rows+=("$line")
            n=$((n + 1))
            # Outside the scope (--gpus, an epilog's job), a GPU is shown but not judged.
            if ((FC_SCOPE_GPUS_ON)) && [[ -z ${FC_SCOPE_GPU[${line%%,*}]:-} ]]; then
                continue
            fi
            # Fields: index, uuid, name, used, total; the name is never split on.
            used=${line%,*}
            used=${used##*,}
            used=${used//[[:space:]]/}
            if [[ $used =~ ^[0-9]+$ ]]; then
                ((used > max)) && over=$((over + 1))
            else
                unknown=$((unknown + 1))
                no_number+=" GPU${line%%,*}=${used:-empty}"
            fi
        done <<<"$out"
        if ((n == 0)); then
            state=error
        elif ((unknown)); then
            state=unknown
        elif ((over)); then
            state=dirty
        else
            state=ok
        fi
        # Where a killed GPU holder's parent lives on (see fc_note_respawn_risk), a first
        # clean read is confirmed once opt_settle_ms have passed since the last signal: a
        # holder respawned by its supervisor would otherwise pass as clean in the gap
        # between kill and restart. The time the targets took to die counts towards it.
        if [[ $state == ok ]] && ((!FC_CHECK && !settled && FC_RESPAWN_RISK)); then
            settled=1
            fc_now_us
            left=$((opt_settle_ms - (REPLY - FC_LAST_SIGNAL_US) / 1000))
            if ((left > 0)); then
                printf -v wait_s '%d.%03d' $((left / 1000)) $((left % 1000))
                fc_nap "$wait_s"
                continue
            fi
        fi
        # After the settle, a watched parent with a new child is restarting what we
        # killed, however slowly that child starts: wait for it up to the deadline, and
        # call the host dirty even if it has not taken its GPU yet.
        if [[ $state == ok ]] && ((!FC_CHECK && settled)) && fc_respawned; then
            respawn=$REPLY
            state=dirty
        fi
        [[ $state == dirty ]] || break
        fc_now_us
        ((FC_CHECK || (REPLY - t0) / 1000 >= opt_timeout_ms)) && break
        fc_nap "$opt_interval_s"
    done
    fc_now_us
    local ms=$(((REPLY - t0) / 1000))
    for line in "${rows[@]}"; do
        fc_rec gpu "$line"
    done
    # Who holds the GPUs matters only where some GPU is still in use; skipping it on a clean
    # host saves two process-table scans and an nvidia-smi call (a fleet-wide status is
    # mostly clean hosts).
    [[ $state == ok ]] || fc_report_holders
    case $state in
        ok) fc_rec verify ok "$max" "$ms" "every GPU at or under $max MiB" ;;
        dirty)
            if [[ -n $respawn ]]; then
                fc_rec verify dirty "$max" "$ms" "respawned after it was killed: $respawn"
            else
                fc_rec verify dirty "$max" "$ms" "$over GPU(s) above $max MiB after ${ms} ms"
            fi
            ;;
        unknown) fc_rec verify unknown "$max" "$ms" \
            "nvidia-smi gave no number for memory.used:$no_number (check the driver: run nvidia-smi on the host)" ;;
        *) fc_rec verify error "$max" "$ms" "nvidia-smi listed no GPU: $out" ;;
    esac
}

# The processes holding GPUs, one record each: device-file holders, else compute apps.
fc_report_holders() {
    local out line pid target any_holder=0
    # Device-file holders first: one `ls` names each process and the GPU it holds. Ask
    # nvidia-smi (a second call, 20 ms of a busy host's status) only when that found
    # nobody, e.g. when the holder lives in a container whose processes we cannot see.
    while read -r pid _ target; do
        [[ $target =~ ^/dev/nvidia[0-9]+$ ]] || continue
        fc_cmdline "$pid"
        fc_rec holder "$pid" "$target" "$REPLY"
        any_holder=1
    done < <(fc_open_fds /dev/nvidia)
    ((any_holder)) && return 0
    if out=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid \
        --format=csv,noheader,nounits 2>/dev/null); then
        while IFS= read -r line; do
            [[ -n ${line//[[:space:]]/} ]] && fc_rec app "$line"
        done <<<"$out"
    fi
}

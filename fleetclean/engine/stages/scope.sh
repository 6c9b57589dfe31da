# shellcheck shell=bash disable=SC2034,SC2154
# (FC_SCOPE_* are assigned by the rendered script around this template.)
# The scope of a run on a shared node. With FC_SCOPED set, fc_protected asks
# fc_out_of_scope about every process a stage would signal:
#   FC_SCOPE_USER  --user: a name or a UID; only that user's processes are signalled;
#   FC_SCOPE_JOB   an epilog's Slurm job (SLURM_JOB_ID): the processes of any *other* job
#                  are never touched (its own leftovers are the slurm-job stage's targets);
#   FC_SCOPE_GPUS  --gpus: nvidia-smi indexes; FC_SCOPE_GPU_IDS=slurm: an epilog's, the
#                  minors in SLURM_JOB_GPUS mapped to indexes here. gpu-holders kills only
#                  holders of those GPUs, the verification judges only those, and no stage
#                  signals a process that holds other GPUs and none of those.

declare -gA FC_UID_OF=() FC_JOB_OF=() FC_SCOPE_GPU=() FC_GPU_INDEX_OF_MINOR=()
declare -gA FC_GPU_INDEX_OF_UUID=() FC_OTHER_GPUS_OF=()
FC_SCOPE_UID=""
FC_SCOPE_GPUS_ON=0

# Resolve the scope on this host and say it in a "scope" record (user, UID, job, the GPUs
# judged); a user this host does not know, or GPUs it cannot tell apart, halt the stages.
fc_scope_begin() {
    # What fc_begin held leaves now: `id` and the job's GPUs may take their time.
    fc_release
    FC_SCOPED=1
    if [[ $FC_SCOPE_USER =~ ^[0-9]+$ ]]; then
        FC_SCOPE_UID=$FC_SCOPE_USER
    elif [[ -n $FC_SCOPE_USER ]] && ! FC_SCOPE_UID=$(id -u -- "$FC_SCOPE_USER" 2>/dev/null); then
        FC_SCOPE_UID=""
        fc_scope_halt "--user $FC_SCOPE_USER: no such user on this host"
    fi
    if [[ -n ${FC_SCOPE_GPU_IDS:-} ]] && ! fc_scope_gpus; then
        if [[ $FC_SMI_HUNG == *"(state D)"* ]]; then
            # The driver is hung: said as the verification says it (the host is faulty),
            # and nobody is signalled, as wherever the GPUs are unknown. (One that SIGKILL
            # ended, slow, is the error below: nothing was judged.)
            fc_rec nvsmi 124 "$FC_SMI_HUNG"
            FC_HALT=1
            FC_HALT_REASON="the GPU driver is hung"
        else
            fc_scope_halt "$REPLY"
        fi
    fi
    local IFS=,
    fc_rec scope "$FC_SCOPE_USER" "$FC_SCOPE_UID" "$FC_SCOPE_JOB" "${FC_SCOPE_GPUS[*]}" \
        "$FC_SCOPE_GPU_IDS"
}

fc_scope_halt() {
    FC_HALT=1
    FC_HALT_REASON=$1
    fc_rec error "$1"
}

# FC_SCOPE_GPU[index] for every GPU of the scope; REPLY says why when they cannot be known.
# --gpus names indexes; SLURM_JOB_GPUS names device minors (the N of /dev/nvidiaN in
# gres.conf's File=), which need not be the indexes nvidia-smi shows.
fc_scope_gpus() {
    local minor index
    local -a minors=()
    FC_SCOPE_GPUS_ON=1
    fc_gpu_map || return 1
    if [[ $FC_SCOPE_GPU_IDS == slurm ]]; then
        FC_SCOPE_GPUS=()
        IFS=, read -r -a minors <<<"${SLURM_JOB_GPUS:-}"
        for minor in "${minors[@]}"; do
            index=${FC_GPU_INDEX_OF_MINOR[$minor]:-}
            if [[ -z $index ]]; then
                REPLY="SLURM_JOB_GPUS=$SLURM_JOB_GPUS: no GPU here has device minor $minor"
                return 1
            fi
            FC_SCOPE_GPUS+=("$index")
        done
    fi
    for index in "${FC_SCOPE_GPUS[@]}"; do
        if [[ -z ${FC_GPU_UUID_OF[$index]:-} ]]; then
            REPLY="--gpus: this host has no GPU $index (nvidia-smi: ${!FC_GPU_UUID_OF[*]})"
            return 1
        fi
        FC_SCOPE_GPU[$index]=1
    done
}

# Each GPU's index by its device minor and by its UUID, from nvidia-smi's bus ids and the
# driver's file of each (lib.sh: fc_gpu_info_load, "Device Minor: N").
fc_gpu_map() {
    local out index uuid bus
    declare -gA FC_GPU_UUID_OF=()
    if ! fc_smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader; then
        [[ -n $FC_SMI_HUNG ]] || REPLY="nvidia-smi: $REPLY"
        REPLY="cannot tell this host's GPUs apart: ${REPLY%%$'\n'*}"
        return 1
    fi
    out=$REPLY
    while IFS=', ' read -r index uuid bus; do
        [[ $index =~ ^[0-9]+$ && -n $uuid ]] || continue  # an empty key ends the script
        fc_bus_dir "$bus"
        bus=$REPLY
        if [[ -z ${FC_GPU_INFO[$bus]:-} ]] && ! fc_gpu_info_load "$bus"; then
            REPLY="cannot tell which /dev/nvidiaN is GPU $index: no Device Minor, GPU UUID"
            REPLY+=" or Model in $FC_GPU_DRIVER/$bus/information"
            return 1
        fi
        # The driver's file must be this GPU's: a wrong one would put another GPU's (another
        # job's) processes in the scope.
        if [[ ${FC_GPU_INFO[$bus]#* } != "$uuid, "* ]]; then
            REPLY="cannot tell which /dev/nvidiaN is GPU $index: $FC_GPU_DRIVER/$bus/information"
            REPLY+=" is not GPU $uuid's"
            return 1
        fi
        FC_GPU_INDEX_OF_MINOR[${FC_GPU_INFO[$bus]%% *}]=$index
        FC_GPU_INDEX_OF_UUID[$uuid]=$index
        FC_GPU_UUID_OF[$index]=$uuid
    done <<<"$out"
}

# True when device file $1 (/dev/nvidiaN) or GPU UUID $1 is a GPU of the scope.
fc_gpu_in_scope() {
    local index
    if [[ $1 == /dev/nvidia* ]]; then
        index=${FC_GPU_INDEX_OF_MINOR[${1#/dev/nvidia}]:-}
    else
        index=${FC_GPU_INDEX_OF_UUID[$1]:-}
    fi
    [[ -n $index && -n ${FC_SCOPE_GPU[$index]:-} ]]
}

# REPLY: why PID is outside the scope, or "" when it is inside.
fc_out_of_scope() {
    local pid=$1
    if [[ -n $FC_SCOPE_USER ]]; then
        fc_uid_of "$pid"
        if [[ -z $FC_SCOPE_UID || $REPLY != "$FC_SCOPE_UID" ]]; then
            REPLY="not user $FC_SCOPE_USER's"
            return 0
        fi
    fi
    if [[ -n $FC_SCOPE_JOB ]]; then
        fc_job_of "$pid"
        if [[ -n $REPLY && $REPLY != "$FC_SCOPE_JOB" ]]; then
            REPLY="belongs to Slurm job $REPLY"
            return 0
        fi
    fi
    if ((FC_SCOPE_GPUS_ON)) && fc_holds_only_other_gpus "$pid"; then
        REPLY="holds only GPUs outside the scope"
        return 0
    fi
    REPLY=""
}

# True when PID uses GPUs and none of them is a GPU of the scope (read once per process:
# asked of each candidate target only). A process nvidia-smi lists uses the GPUs it lists
# it on: CUDA opens the device file of every GPU it may see (no CUDA_VISIBLE_DEVICES, no
# device cgroup) and has a context, which nvidia-smi lists, on those it uses, so a job of
# another GPU holds this one's file too. Any other process by its /dev/nvidiaN (one `ls`),
# and, where those do not put it out of the scope, by its nearest listed kin's GPUs (its
# job's: lib.sh, fc_listed_kin), which only ever spare it: a process that has a GPU of the
# scope's file open, inherited or opened beside a job of other GPUs, or none.
fc_holds_only_other_gpus() {
    local key="$1:${FC_START[$1]:-}" line other=0
    fc_scope_apps  # (read again after a signal, which clears the verdicts below)
    if [[ -n ${FC_OTHER_GPUS_OF[$key]+set} ]]; then
        :
    elif [[ -n ${FC_SCOPE_APPS[$1]:-} ]]; then
        fc_only_other_gpus "${FC_SCOPE_APPS[$1]}" && other=1
        FC_OTHER_GPUS_OF[$key]=$other
    else
        # The listing read in blocks and escaped (lib.sh: fc_open_fds says why), its lines
        # looked at only where it names a GPU at all.
        fc_output fc_ls "/proc/${FC_LIVE_DIR[$1]:-$1}/fd"
        if [[ $REPLY == *" -> /dev/nvidia"[0-9]* ]]; then
            fc_lines "$REPLY"
            for line in "${FC_LINES[@]}"; do
                [[ $line == *" -> /dev/nvidia"[0-9]* ]] || continue
                if fc_gpu_in_scope "${line##* -> }"; then
                    other=0
                    break
                fi
                other=1
            done
        fi
        if ((!other)) && fc_listed_kin "$1" FC_SCOPE_APPS && fc_only_other_gpus "$REPLY"; then
            other=1
        fi
        FC_OTHER_GPUS_OF[$key]=$other
    fi
    ((FC_OTHER_GPUS_OF[$key]))
}

# True when none of the GPUs (UUIDs) in $1 is one of the scope.
fc_only_other_gpus() {
    local uuid
    for uuid in $1; do
        fc_gpu_in_scope "$uuid" && return 1
    done
    return 0
}

# FC_SCOPE_APPS[pid]: the UUIDs of the GPUs nvidia-smi lists each compute process on. A
# run that signals reads it without the names, which a process writes itself (gpu-holders.sh
# says why: PIDs and UUIDs come from the driver), at the first process asked about, and
# again once a signal went out since (a PID it named may be another process's by then); a
# read-only run that has read its GPUs takes their list, where it only labels. What came
# is taken where nvidia-smi failed on a GPU; a process it does not list is told by its
# device files.
declare -gA FC_SCOPE_APPS=()
FC_SCOPE_APPS_US=-1
fc_scope_apps() {
    # Strictly before: where the clock steps 10 ms (bash 4.4), a signal in the read's step
    # may have come after it.
    ((FC_SCOPE_APPS_US >= 0 && FC_LAST_SIGNAL_US < FC_SCOPE_APPS_US)) && return 0
    local i
    local -a apps=()
    fc_now_us
    FC_SCOPE_APPS_US=${REPLY:-0}
    FC_SCOPE_APPS=() FC_OTHER_GPUS_OF=()
    if ((FC_CHECK && ${#FC_VROWS[@]})); then
        fc_verify_apps
        apps=("${FC_VAPPS[@]}")
    else
        fc_smi --no-err --query-compute-apps=pid,gpu_uuid --format=csv,noheader
        if (($? != 124)); then
            fc_lines "$REPLY"
            apps=("${FC_LINES[@]}")
        fi
    fi
    fc_apps_pairs "${apps[@]}"
    for i in "${!FC_APP_PID[@]}"; do
        FC_SCOPE_APPS[${FC_APP_PID[i]}]+=" ${FC_APP_UUID[i]}"
    done
}

# REPLY: the real UID of PID ("" when it is gone), read once per process.
fc_uid_of() {
    local pid=$1 key
    key="$pid:${FC_START[$pid]:-}"
    if [[ -n ${FC_UID_OF[$key]+set} ]]; then
        REPLY=${FC_UID_OF[$key]}
        return 0
    fi
    fc_proc_uids "$pid"
    REPLY=${FC_UIDS[0]:-}
    FC_UID_OF[$key]=$REPLY
}

# REPLY: the Slurm job PID belongs to ("" for none), read once per process: its cgroup
# (proctrack/cgroup: .../job_N/...), else a slurmstepd ancestor ("slurmstepd: [N.S]"), else
# the SLURM_JOB_ID it inherited (an orphan reparented away from its step keeps that one).
fc_job_of() {
    local pid=$1 key line p hops=0 step='^slurmstepd: \[([0-9]+)\.'
    local -a env=() cgroups=()
    key="$pid:${FC_START[$pid]:-}"
    if [[ -n ${FC_JOB_OF[$key]+set} ]]; then
        REPLY=${FC_JOB_OF[$key]}
        return 0
    fi
    REPLY=""
    # In one pass, as every /proc file is read (lib.sh: fc_proc_field): a line at a time,
    # one that changed length meanwhile (the process moved) put the rest out of place.
    { mapfile -t cgroups <"/proc/$pid/cgroup"; } 2>/dev/null
    for line in "${cgroups[@]}"; do
        if [[ $line =~ /job_([0-9]+)(/|$) ]]; then
            REPLY=${BASH_REMATCH[1]}
            break
        fi
    done
    p=$pid
    while [[ -z $REPLY && -n $p && $p != 0 && $p != 1 ]] && ((hops++ < 64)); do
        [[ ${FC_CMD[$p]:-} =~ $step ]] && REPLY=${BASH_REMATCH[1]}
        p=${FC_PPID[$p]:-}
    done
    if [[ -z $REPLY ]]; then
        { mapfile -d '' -t env <"/proc/${FC_LIVE_DIR[$pid]:-$pid}/environ"; } 2>/dev/null || :
        for line in "${env[@]}"; do
            if [[ $line == SLURM_JOB_ID=* ]]; then
                REPLY=${line#SLURM_JOB_ID=}
                break
            fi
        done
    fi
    FC_JOB_OF[$key]=$REPLY
}

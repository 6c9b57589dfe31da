#!/bin/bash
# Test double for nvidia-smi: 8 GPUs; a GPU's used memory is 1000 MiB per CUDA process (with
# /dev/nvidia-uvm open) holding /dev/nvidiaN open (nvidia-persistenced: none). $FAKE_NVSMI_MODE (read from /tmp/fake-nvsmi-mode) makes it misbehave.
mode=$(cat /tmp/fake-nvsmi-mode 2>/dev/null)
echo "$*" >>/tmp/fake-nvsmi-calls  # what was asked, for the tests that count the reads
case $mode in
    nvml) echo "Failed to initialize NVML: Driver/library version mismatch"; exit 18 ;;
    nodriver) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9 ;;
esac
declare -A used=() holders=() cuda=() held=()
while IFS= read -r line; do
    case $line in
        /proc/*/fd:) pid=${line#/proc/}; pid=${pid%/fd:} ;;
        *" -> /dev/nvidia-uvm") cuda[$pid]=1 ;;
        *" -> /dev/nvidia"[0-9]*)
            dev=${line##* -> /dev/nvidia}
            [[ $dev =~ ^[0-9]+$ ]] || continue
            [[ " ${held[$pid]:-} " == *" $dev "* ]] || held[$pid]+=" $dev" ;;
    esac
done < <(LC_ALL=C ls -l /proc/[0-9]*/fd 2>/dev/null)
# Like the real one: only a CUDA context (/dev/nvidia-uvm open) uses memory; an NVML user
# (a monitoring agent, nvidia-persistenced) holds the device files and none.
for pid in "${!held[@]}"; do
    [[ -n ${cuda[$pid]:-} ]] || continue
    argv0=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -n 1)
    [[ $argv0 == nvidia-persistenced ]] && continue
    for dev in ${held[$pid]}; do
        holders[$dev]+=" $pid"
        used[$dev]=$(( ${used[$dev]:-0} + 1000 ))
    done
done
for arg in "$@"; do
    case $arg in
        --query-gpu=*)
            for i in 0 1 2 3 4 5 6 7; do
                u=${used[$i]:-0}
                [[ $mode == na ]] && u='[N/A]'
                echo "$i, GPU-0000000$i-fake-fake-fake-00000000000$i, NVIDIA H200, $u, 143771"
            done ;;
        --query-compute-apps=*)
            for i in "${!holders[@]}"; do
                for pid in ${holders[$i]}; do
                    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
                    echo "$pid, $comm, 1000, GPU-0000000$i-fake-fake-fake-00000000000$i"
                done
            done ;;
    esac
done
exit 0

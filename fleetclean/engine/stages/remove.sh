# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "remove": delete each path of opt_paths; opt_globs[i]=1 marks a glob written in
# the playbook (a variable's value is never globbed). Refuses empty paths and
# anything that resolves to / or a top-level directory (/, /dev, /etc, ...), whatever
# "..", symlink or glob led there. A path or glob that matches nothing is an error
# unless opt_missing_ok is 1.
fc_stage_remove() {
    local p real shown i
    local -a found=() refused=() missing=()
    for i in "${!opt_paths[@]}"; do
        p=${opt_paths[i]}
        if [[ -z $p ]]; then
            refused+=("(empty path)")
            continue
        fi
        local -a exp=()
        if ((opt_globs[i])); then
            # IFS empty: the value is globbed but never word-split.
            local IFS=''
            shopt -s nullglob
            # shellcheck disable=SC2206  # globbing the value is the point here
            exp=($p)
            shopt -u nullglob
            unset IFS
        elif [[ -e $p || -L $p ]]; then
            exp=("$p")
        fi
        if ((${#exp[@]} == 0)); then
            missing+=("$p")
            continue
        fi
        for shown in "${exp[@]}"; do
            # "." and "..", which a glob such as dir/.* gives before bash 5.2 (globskipdots)
            # and rm refuses, are never what a glob was written for.
            [[ $shown == */. || $shown == */.. ]] && continue
            # Without its trailing '/': rm went through a symlink so written and emptied
            # the directory it names; now a symlink is removed as the link it is.
            while [[ $shown == ?*/ ]]; do shown=${shown%/}; done
            real=$(realpath -m -- "$shown")
            if [[ $real != /*/* ]]; then
                refused+=("$shown (resolves to $real)")
            elif ((opt_globs[i])) && [[ -L ${shown%/*} ]]; then
                # A glob in a directory that is a symlink removes what it points to: written
                # for the directory itself, not for where it leads (a symlink higher up,
                # /scratch to /lustre, is the site's layout, and stays allowed).
                refused+=("$shown (its directory is a symlink to ${real%/*}: write that path)")
            elif fc_mounted_under "$real"; then
                # rm's --one-file-system stops at another device, not at a bind mount of
                # the same one, whose files are someone else's.
                refused+=("$shown (a file system is mounted under it, at $REPLY)")
            else
                found+=("$shown")
            fi
        done
    done
    FC_MATCHED=${#found[@]}
    if ((${#refused[@]})); then
        FC_STATUS=failed
        FC_MESSAGE="refusing to remove: ${refused[*]}"
        return 0
    fi
    for p in "${found[@]}"; do
        if ((FC_CHECK)); then
            fc_rec change "$FC_IDX" "would remove $p"
        elif out=$(rm -rf --one-file-system -- "$p" 2>&1); then
            fc_rec change "$FC_IDX" "removed $p"
        else
            FC_STATUS=failed
            FC_MESSAGE="cannot remove $p: $out"
            return 0
        fi
    done
    if ((${#missing[@]})) && ((!opt_missing_ok)); then
        FC_STATUS=failed
        FC_MESSAGE="not found: ${missing[*]}"
    elif ((${#found[@]} == 0)); then
        FC_MESSAGE="nothing to remove"
    elif ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would remove ${#found[@]} path(s)"
    else
        FC_MESSAGE="removed ${#found[@]} path(s)"
    fi
}

# True, REPLY the first, when a mount point lies under directory $1 (not at it: a dump
# directory that is its own tmpfs is emptied as asked), by this mount namespace's table.
fc_mounted_under() {
    local line mount
    [[ -n ${FC_MOUNTS+set} ]] || mapfile -t FC_MOUNTS </proc/self/mountinfo 2>/dev/null
    for line in "${FC_MOUNTS[@]}"; do
        # "ID PARENT MAJ:MIN ROOT MOUNT_POINT ...", the point's blank, tab, newline and
        # backslash written \040, \011, \012 and \134.
        mount=${line#* * * * }
        mount=${mount%% *}
        mount=${mount//\\040/ } mount=${mount//\\011/$'\t'} mount=${mount//\\012/$'\n'}
        mount=${mount//\\134/\\}
        if [[ $mount == "$1"/* ]]; then
            REPLY=$mount
            return 0
        fi
    done
    return 1
}

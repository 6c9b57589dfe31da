# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "restore": put opt_file back from opt_file$opt_backup_suffix. The backup is
# copied to a temporary file in the same directory, then renamed over the file, so a
# half-copied file never replaces the original.
fc_stage_restore() {
    local file=$opt_file backup=$opt_file$opt_backup_suffix dir tmp
    if [[ -z $file ]]; then
        FC_STATUS=ok
        FC_MESSAGE="no file to restore (file is empty)"
        return 0
    fi
    if [[ ! -f $backup ]]; then
        FC_STATUS=failed
        FC_MESSAGE="backup missing: $backup (cannot restore $file)"
        return 0
    fi
    if [[ -d $file ]]; then
        FC_STATUS=failed
        FC_MESSAGE="$file is a directory, not a file to restore from $backup"
        return 0
    fi
    # A symlink is restored where it points: renamed over, the link became a copy and the
    # file it named stayed patched.
    if [[ -L $file ]] && ! file=$(realpath -e -- "$file" 2>&1); then
        FC_STATUS=failed
        FC_MESSAGE="$opt_file is a symlink to nothing: $file"
        return 0
    fi
    # A backup that is the file itself (a link to it) holds the patch, not the original.
    if [[ $backup -ef $file ]]; then
        FC_STATUS=failed
        FC_MESSAGE="backup $backup is $file itself (a link to it), not a copy of the original"
        return 0
    fi
    FC_MATCHED=1
    if ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would restore $file from $backup"
        fc_rec change "$FC_IDX" "$FC_MESSAGE"
        return 0
    fi
    dir=$(dirname -- "$file")
    if ! tmp=$(mktemp -- "$dir/.fleetclean-restore.XXXXXX" 2>&1); then
        FC_STATUS=failed
        FC_MESSAGE="cannot create a temporary file in $dir: $tmp"
        return 0
    fi
    if ! out=$(cp --preserve=mode,ownership,timestamps -- "$backup" "$tmp" 2>&1 &&
        mv -f -T -- "$tmp" "$file" 2>&1); then
        rm -f -- "$tmp"
        FC_STATUS=failed
        FC_MESSAGE="restore of $file from $backup failed: $out"
        return 0
    fi
    FC_STATUS=ok
    FC_MESSAGE="restored $opt_file from $backup"
    fc_rec change "$FC_IDX" "$FC_MESSAGE"
}

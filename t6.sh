source /tmp/review4/lib.bash
FC_CHECK=0 FC_IDX=1 FC_STATUS=ok FC_FORCE=0 FC_STAGE_NAME=g
opt_path=$1 opt_wait_for_file='' opt_wait_for_line='' opt_timeout_ms=0
fc_stage_guard
echo "STATUS=$FC_STATUS MSG=$FC_MESSAGE"

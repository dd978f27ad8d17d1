-- subject_write: a SEGMENT_SUBJECT node's start or report (statecore.subject_writes), written to that
-- subject's own fields alone: its node field 'node:<id>', its result 'result:<box_id>', the count of
-- live subject nodes 'subjects_live', its index members, its events and audit entry. Nothing else of
-- the job is read or compared, so siblings never make it plan again: the job's version is incremented
-- (a subject's write is a change of the job, SPEC §3) but not compared. Applied only while the node
-- is the one the caller planned from (its field byte for byte: live, not replaced by a retry, not
-- ended) on a live job; and a report only while another subject node is still live (the count after
-- it > 0): the last one's report moves the job on, so it goes through apply_report.lua with the whole
-- job, version-guarded, exactly once. Anything else answers {'FULL'} with nothing written, and the
-- caller takes apply_report.lua's path, which has the answer (IGNORED, DUPLICATE, the move).
-- KEYS: see _lib.lua
-- ARGV[5] node_instance_id  ARGV[6] the node's field as the plan read it
-- ARGV[7] '1' = report (recorded in the reports set; the node's field goes), '0' = started
-- ARGV[8] the node's field after ('' with a report)  ARGV[9] box_id  ARGV[10] the subject's result after
-- ARGV[11] events JSON [[type, data JSON], ...]  ARGV[12] members JSON [[index, 'add'|'del', score], ...]
-- ARGV[13] the action the audit names (NODE_STARTED, NODE_REPORT)
-- Returns {'OK', version} | {'FULL'} | {'JOB_NOT_FOUND'}
if redis.call('EXISTS', K_META) == 0 then return {'JOB_NOT_FOUND'} end
local nid, final = ARGV[5], ARGV[7] == '1'
local field = NODE_FIELD .. nid
local m = redis.call('HMGET', K_META, 'status', 'terminal', field, 'subjects_live')
if m[2] == '1' or m[3] ~= ARGV[6] then return {'FULL'} end
if redis.call('SISMEMBER', K_REPORTS, nid) == 1 then return {'FULL'} end
if redis.call('SISMEMBER', K_REPORTS, 'timeout:' .. nid) == 1 then return {'FULL'} end
local live = tonumber(m[4] or '')
if final and (not live or live <= 1) then return {'FULL'} end
local version = redis.call('HINCRBY', K_META, 'version', 1)
if final then
  redis.call('SADD', K_REPORTS, nid)
  redis.call('HDEL', K_META, field)
  redis.call('HINCRBY', K_META, 'subjects_live', -1)
else
  redis.call('HSET', K_META, field, ARGV[8])
end
redis.call('HSET', K_META, RESULT_FIELD .. ARGV[9], ARGV[10], 'updated_at', NOW)
local member_index = {queued = K_QUEUED, running = K_RUNNING, heartbeats = K_HEARTBEATS}
for _, op in ipairs(cjson.decode(ARGV[12])) do
  index(member_index[op[1]], {op[2], op[3]}, JOB_ID .. '|' .. nid)
end
for _, ev in ipairs(cjson.decode(ARGV[11])) do
  append_event(ev[1], m[1], ev[2], version)
  count_event(ev[1], ev[2])
end
audit(ARGV[13], 'APPLIED:' .. m[1])
return {'OK', version}

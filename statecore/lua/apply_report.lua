-- apply_report: a node's result (or its start), applied at most once per node_instance_id and
-- only while that node is the job's current node, or one of its live subject nodes, of a live job;
-- otherwise recorded as ignored.
-- KEYS: see _lib.lua
-- ARGV[5] node_instance_id  ARGV[6] version the plan was computed from  ARGV[7] plan JSON
-- ARGV[8] '1' = final report (recorded in the reports set), '0' = node started
-- ARGV[9] node_type
-- ARGV[10] '1' = the inspector's verdict on the node (its deadline passed, or its executor was lost),
--         recorded as timeout:<nid>, so the model's own late report is still told apart from a
--         replay: it is ignored with an event
-- ARGV[11] with ARGV[10] = '1': the inspector's lease (owner|fencing token) on the job's partition;
--         a verdict from an inspector that no longer holds it is refused (FENCED)
-- ARGV[12] the action the audit names (NODE_STARTED, NODE_REPORT, NODE_TIMED_OUT, NODE_LOST,
--         NODE_ATTEMPT_FAILED, DEAD_LETTER_REPLAY): every answer but JOB_NOT_FOUND, FENCED and
--         STALE appends an entry, outcome APPLIED:<status> or IGNORED:<reason | DUPLICATE>
-- ARGV[13] what an inspector's verdict re-checks on this server's clock before it acts ('' = nothing):
--         'lapse:<ms>'    the node's heartbeat is still older than <ms> (it did not beat or start since)
--         'deadline:<ms>' the node's deadline passed more than <ms> ago
--         otherwise {'ALIVE'}: the verdict was read from an index that has moved on since
-- ARGV[14] the auto-approve policy whose decision this plan carries ('' = none: statecore.auto_plan):
--         its own entry follows the report's in this same step, actor policy:<name>@<hash>, action
--         AUTO_APPROVE, with the version it decided on and ARGV[15], the snapshot id of the list it approved
-- Returns {'OK', version} | {'DUPLICATE'} | {'IGNORED', reason} | {'JOB_NOT_FOUND'} | {'STALE'} | {'FENCED'}
--         | {'ALIVE'}
if redis.call('EXISTS', K_META) == 0 then return {'JOB_NOT_FOUND'} end
local nid, final, by_inspector = ARGV[5], ARGV[8] == '1', ARGV[10] == '1'
if by_inspector and redis.call('GET', K_LEASE) ~= ARGV[11] then return {'FENCED'} end
local timeout_mark = 'timeout:' .. nid
local mark = by_inspector and timeout_mark or nid
local ACTION = ARGV[12]
local function duplicate()
  audit(ACTION, 'IGNORED:DUPLICATE')
  return {'DUPLICATE'}
end
if redis.call('SISMEMBER', K_REPORTS, nid) == 1 then return duplicate() end
local timed_out = redis.call('SISMEMBER', K_REPORTS, timeout_mark) == 1
if timed_out and by_inspector then return duplicate() end
local m = redis.call('HMGET', K_META, 'status', 'version', 'node_id', 'terminal')
local reason = nil
if timed_out then
  reason = is_live_node(m[3], nid) and 'NODE_TIMED_OUT' or 'NODE_SUPERSEDED'
elseif m[4] == '1' then
  reason = 'JOB_TERMINAL'
elseif not is_live_node(m[3], nid) then
  reason = 'NODE_SUPERSEDED'
end
if reason then
  if final then
    redis.call('SADD', K_REPORTS, mark)
    keep_ttl_like_meta(K_REPORTS)
    local data = cjson.encode({node_instance_id = nid, node_type = ARGV[9], reason = reason, status = m[1]})
    append_event('REPORT_IGNORED', m[1], data, m[2])
  end
  audit(ACTION, 'IGNORED:' .. reason)
  return {'IGNORED', reason}
end
if m[2] ~= ARGV[6] then return {'STALE'} end
local check, limit = string.match(ARGV[13] or '', '^(%a+):(%d+)$')
if check then
  local index = check == 'lapse' and K_HEARTBEATS or K_RUNNING
  local at = tonumber(redis.call('ZSCORE', index, node_member(nid)) or '')
  if at and at > now_ms() - tonumber(limit) then return {'ALIVE'} end
end
-- No plan: the node is the job's current node but already ended (COMPLETED, FAILED, TIMED_OUT) and
-- this report is not in the reports set, which a restore from the live mirror does not bring back
-- (statecore/restore.py): its result was applied before, so it is a replay. Nothing is written.
if ARGV[7] == '' then return duplicate() end
if final then redis.call('SADD', K_REPORTS, mark) end
local version = apply_plan(ARGV[7])
local applied = 'APPLIED:' .. redis.call('HGET', K_META, 'status')
audit(ACTION, applied)
if (ARGV[14] or '') ~= '' then
  ACTOR = ARGV[14]
  audit('AUTO_APPROVE', applied, ARGV[6], ARGV[15])
end
return {'OK', version}

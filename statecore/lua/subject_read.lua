-- subject_read: what a subject node's start or report reads before subject_write, in one round trip
-- (statecore.subject_writes; was three: HMGET, HGET, TIME). Read-only, standalone.
-- KEYS[1] the job's meta
-- ARGV[1] the node's field  ARGV[2] the prefix of a subject's result field (keys.SUBJECT_RESULT_FIELD)
-- Returns {the node's JSON, terminal, the subject's result JSON, TIME's seconds, TIME's microseconds};
-- false (nil) for a field that is absent, the result too when the node names no box. TIME is the clock
-- of the server holding the job: on a cluster, every master keeps its own (statecore.lifecycle.server_ms).
local got = redis.call('HMGET', KEYS[1], ARGV[1], 'terminal')
local node, terminal, result = got[1], got[2], false
if node then
  local ok, decoded = pcall(cjson.decode, node)
  if ok and type(decoded) == 'table' and type(decoded['box_id']) == 'string' then
    result = redis.call('HGET', KEYS[1], ARGV[2] .. decoded['box_id'])
  end
end
local t = redis.call('TIME')
return {node, terminal, result, t[1], t[2]}

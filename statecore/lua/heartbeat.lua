-- heartbeat: the process running a node says it is still at work. Touches only the heartbeat
-- index and the node's executor record (never job state, never the version); a node that is not
-- the job's running node any more (completed, superseded by a re-dispatch, job gone) is not
-- renewed, and the caller stops. Standalone (no shared prologue).
-- KEYS[1] the job's meta   KEYS[2] the partition's heartbeat index   KEYS[3] the node's executor
--         record (who runs the node; the inspector asks it before a re-dispatch) — one slot
-- ARGV[1] job_id   ARGV[2] node_instance_id   ARGV[3] unused (the time is this server's: TIME, the
--         clock every deadline and lapse is read on, whatever the clock of the process that beats)
-- ARGV[4] the executor's name ('' = do not record)   ARGV[5] the record's time to live (ms)
-- ARGV[6] 'release': the executor is done with the node; drop its record if it is still its own
-- Returns 1 when renewed (or released), 0 when the node is no longer running
if ARGV[6] == 'release' then
  if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
  return 1
end
-- A live subject node (statecore.subjects) has a meta field and an index member of its own.
local member = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'node:' .. ARGV[2]) == 1 then
  member = ARGV[1] .. '|' .. ARGV[2]
elseif redis.call('HGET', KEYS[1], 'node_id') ~= ARGV[2] then
  return 0
end
if not redis.call('ZSCORE', KEYS[2], member) then return 0 end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[2], 'XX', 'GT', t[1] * 1000 + math.floor(t[2] / 1000), member)
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5]) end
return 1

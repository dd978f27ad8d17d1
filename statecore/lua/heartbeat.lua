-- heartbeat: the process running a node says it is still at work. Touches only the heartbeat
-- index (never job state, never the version); a node that is not the job's running node any more
-- (completed, superseded by a re-dispatch, job gone) is not renewed, and the caller stops.
-- Standalone (no shared prologue).
-- KEYS[1] the job's meta   KEYS[2] the partition's heartbeat index (same slot)
-- ARGV[1] job_id   ARGV[2] node_instance_id   ARGV[3] now (ms)
-- Returns 1 when renewed, 0 when the node is no longer running
if redis.call('HGET', KEYS[1], 'node_id') ~= ARGV[2] then return 0 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], 'XX', 'GT', ARGV[3], ARGV[1])
return 1

-- prune_finished: drop finished jobs whose retention passed from the partition's listing index and
-- uncount their final status (statecore.counters.prune). Standalone: no shared prologue.
-- KEYS[1] expiring  KEYS[2] jobs  KEYS[3] counts  KEYS[4] finished (job_id -> final status)
-- ARGV[1] now (ms)  ARGV[2] at most this many jobs
-- Returns how many jobs it dropped.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job_id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], job_id)
  redis.call('ZREM', KEYS[2], job_id)
  local status = redis.call('HGET', KEYS[4], job_id)
  if status then
    redis.call('HINCRBY', KEYS[3], status, -1)
    redis.call('HDEL', KEYS[4], job_id)
  end
end
return #gone

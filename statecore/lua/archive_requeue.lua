-- archive_requeue: the archivers' sweep (docs/protocol.md § Archive) queues the copy of finished jobs
-- again whose archive command was lost (deleted by hand, trimmed, gone with a failover). Standalone
-- (no shared prologue): it touches the partition's archive index and stream only.
-- KEYS[1] the partition's jobs waiting for their copy (ZSET)   KEYS[2] the partition's archive stream
-- ARGV[1] now (ms)   ARGV[2] only jobs waiting since at most this (ms)   ARGV[3..] the job ids
-- A job acknowledged meanwhile (no longer in the index) or queued again meanwhile (a newer score) is
-- left alone. Returns how many commands it queued.
local n = 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[2]) then
    redis.call('XADD', KEYS[2], '*', 'job', ARGV[i], 'requeued', '1')
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n

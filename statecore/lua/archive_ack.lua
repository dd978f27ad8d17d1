-- archive_ack: the archive holds the finished job as far as version ARGV[5], event ARGV[6] (the last
-- event's id, which event_seq is, also past a restore: restore_job.lua) and audit entry ARGV[7]
-- (docs/protocol.md § Archive): only now do its records get their retention TTL and a place in
-- the expiring index. A job that went further since the copy (a late REPORT_IGNORED) answers
-- STALE: copy again. ARGV[5] = '' acknowledges whatever the job holds (archiving turned off).
-- OK also ends the queued copy ('archive_queued', _lib.lua's queue_archive) and takes the job out of
-- the index of jobs waiting for their copy (the archivers' sweep).
-- Returns {'OK'} | {'STALE'} | {'NOT_FINISHED'} | {'JOB_NOT_FOUND'}
local m = redis.call('HMGET', K_META, 'version', 'event_seq', 'terminal', 'audit_seq')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[3] ~= '1' then return {'NOT_FINISHED'} end
if ARGV[5] ~= '' and (m[1] ~= ARGV[5] or (m[2] or '0') ~= ARGV[6] or (m[4] or '0') ~= ARGV[7]) then
  return {'STALE'}
end
if RETENTION > 0 and redis.call('TTL', K_META) < 0 then start_retention() end
redis.call('HDEL', K_META, 'archive_queued')  -- the archive holds all: a later entry queues a new copy
redis.call('ZREM', K_ARCHIVE_WAITING, JOB_ID)
return {'OK'}

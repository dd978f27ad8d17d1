-- archive_ack: the archive holds the finished job as far as version ARGV[4] and event ARGV[5]
-- (docs/protocol.md § Archive): only now do its records get their retention TTL and a place in
-- the expiring index. A job that went further since the copy (a late REPORT_IGNORED) answers
-- STALE: copy again. ARGV[4] = '' acknowledges whatever the job holds (archiving turned off).
-- Returns {'OK'} | {'STALE'} | {'NOT_FINISHED'} | {'JOB_NOT_FOUND'}
local m = redis.call('HMGET', K_META, 'version', 'event_seq', 'terminal')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[3] ~= '1' then return {'NOT_FINISHED'} end
if ARGV[4] ~= '' and (m[1] ~= ARGV[4] or (m[2] or '0') ~= ARGV[5]) then return {'STALE'} end
if RETENTION > 0 and redis.call('TTL', K_META) < 0 then start_retention() end
return {'OK'}

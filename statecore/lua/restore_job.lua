-- restore_job: a live job Redis lost comes back from its mirror (docs/protocol.md § Reconcile).
-- ARGV[5] the mirrored meta (JSON object of the hash)   ARGV[6] the mirrored pause history
-- (JSON object token -> pause)   ARGV[7] the plan (a fresh pause, or the node queued again)
-- ARGV[8] the job's created_at (ms), for the listing index
-- The restored job's audit starts a new chain (its first entry: RESTORE; the earlier entries went with
-- Redis, and the archive holds those of finished jobs only).
-- Returns {'OK', version} | {'PRESENT'} (Redis holds the job: nothing is written)
if redis.call('EXISTS', K_META) == 1 then return {'PRESENT'} end
local meta = cjson.decode(ARGV[5])
local flat = {}
for k, v in pairs(meta) do
  -- The audit entries and the events were lost with the rest: a new chain, a new event list (so no
  -- PAUSE_OPENED of the old one to refer to: 'pause_event').
  if k ~= 'audit_head' and k ~= 'audit_seq' and k ~= 'pause_event' then
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
end
redis.call('HSET', K_META, unpack(flat))
for token, p in pairs(cjson.decode(ARGV[6])) do
  redis.call('HSET', K_PAUSES, token, p)
end
redis.call('ZADD', K_JOBS, tonumber(ARGV[8]), JOB_ID)
-- The counters went with the rest: the job counts in its status again (the plan keeps the status).
redis.call('HINCRBY', K_COUNTS, meta.status, 1)
local version = apply_plan(ARGV[7])
audit('RESTORE', 'RESTORED:' .. redis.call('HGET', K_META, 'status'))
return {'OK', version}

-- restore_job: a live job Redis lost comes back from its mirror (docs/protocol.md § Reconcile).
-- ARGV[4] the mirrored meta (JSON object of the hash)   ARGV[5] the mirrored pause history
-- (JSON object token -> pause)   ARGV[6] the plan (a fresh pause, or the node queued again)
-- ARGV[7] the job's created_at (ms), for the listing index
-- Returns {'OK', version} | {'PRESENT'} (Redis holds the job: nothing is written)
if redis.call('EXISTS', K_META) == 1 then return {'PRESENT'} end
local meta = cjson.decode(ARGV[4])
local flat = {}
for k, v in pairs(meta) do
  flat[#flat + 1] = k
  flat[#flat + 1] = v
end
redis.call('HSET', K_META, unpack(flat))
for token, p in pairs(cjson.decode(ARGV[5])) do
  redis.call('HSET', K_PAUSES, token, p)
end
redis.call('ZADD', K_JOBS, tonumber(ARGV[7]), JOB_ID)
-- The counters went with the rest: the job counts in its status again (the plan keeps the status).
redis.call('HINCRBY', K_COUNTS, meta.status, 1)
local version = apply_plan(ARGV[6])
return {'OK', version}

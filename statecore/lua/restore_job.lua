-- restore_job: a live job Redis lost comes back from its mirror (docs/protocol.md § Reconcile).
-- ARGV[5] the mirrored meta (JSON object of the hash)   ARGV[6] the mirrored pause history
-- (JSON object token -> pause)   ARGV[7] the plan (a fresh pause, or the node queued again)
-- ARGV[8] the job's created_at (ms), for the listing index
-- ARGV[9] event_base: the id just before the first event of the new list (statecore.restore: past
-- every id the lost list can have held), so the ids go on increasing and a reader finds event id i
-- at position i - event_base (_lib.lua's append_event, statecore.eventrefs.read_after)
-- ARGV[10] the mirrored records (JSON object): "idem" (intervention_id -> record, as K_IDEM holds them)
-- and "create" (the creation record's fields, written to KEYS[21] when the job has an Idempotency-Key),
-- so a retried intervention, vote or creation is answered as it was before the loss
-- The restored job's audit starts a new chain (its first entry: RESTORE; the earlier entries went with
-- Redis, and the archive holds those of finished jobs only).
-- Returns {'OK', version} | {'PRESENT'} (Redis holds the job: nothing is written)
if redis.call('EXISTS', K_META) == 1 then return {'PRESENT'} end
local meta = cjson.decode(ARGV[5])
local flat = {}
for k, v in pairs(meta) do
  -- The audit entries and the events were lost with the rest: a new chain, a new event list (so no
  -- PAUSE_OPENED of the old one to refer to: 'pause_event'; its ids start after ARGV[9]).
  -- 'mirrored': the version the mirror held, not yet true of the restored job's next version.
  if k ~= 'audit_head' and k ~= 'audit_seq' and k ~= 'pause_event' and k ~= 'event_seq' and k ~= 'event_base'
    and k ~= 'mirrored' then
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
end
redis.call('HSET', K_META, unpack(flat))
redis.call('HSET', K_META, 'event_base', ARGV[9], 'event_seq', ARGV[9])
redis.call('DEL', K_EVENTS)  -- whatever is left of a list without its meta: the new one starts empty
for token, p in pairs(cjson.decode(ARGV[6])) do
  redis.call('HSET', K_PAUSES, token, p)
end
local records = cjson.decode(ARGV[10])
for iid, rec in pairs(records.idem or {}) do
  redis.call('HSET', K_IDEM, iid, rec)
end
if K_CREATE and type(records.create) == 'table' and redis.call('EXISTS', K_CREATE) == 0 then
  for f, v in pairs(records.create) do redis.call('HSET', K_CREATE, f, v) end
end
redis.call('ZADD', K_JOBS, tonumber(ARGV[8]), JOB_ID)
-- The counters went with the rest: the job counts in its status again (the plan keeps the status).
redis.call('HINCRBY', K_COUNTS, meta.status, 1)
local version = apply_plan(ARGV[7])
audit('RESTORE', 'RESTORED:' .. redis.call('HGET', K_META, 'status'))
return {'OK', version}

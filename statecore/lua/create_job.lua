-- create_job: a new job, its first outbox command (DETECT_SUBJECTS; none for a pre-labelled job,
-- which opens its first pause instead) and events, atomically.
-- KEYS: see _lib.lua; KEYS[21] present when the submitter sent an Idempotency-Key.
-- ARGV[5] plan JSON   ARGV[6] the creation's fingerprint (decide.create_fingerprint: the image's
-- sha256, and the review quorum when it is not 1; kept as the record's image_sha)
-- ARGV[7] response body   ARGV[8] created_at (ms)   ARGV[9] the audit outcome when not CREATED (a
-- pre-labelled job's CREATED:PRELABELLED: statecore.prelabelled)
-- The job's first audit entry: SUBMIT, CREATED (a creation replay writes nothing: the job is unchanged).
-- Returns {'OK', version} | {'REPLAY', response} | {'IDEMPOTENCY_CONFLICT', existing_job_id} | {'COLLISION'}
if K_CREATE then
  local rec = redis.call('HMGET', K_CREATE, 'job_id', 'image_sha', 'response')
  if rec[1] then
    if rec[2] == ARGV[6] then return {'REPLAY', rec[3]} end
    return {'IDEMPOTENCY_CONFLICT', rec[1]}
  end
end
if redis.call('EXISTS', K_META) == 1 then return {'COLLISION'} end
local version = apply_plan(ARGV[5])
redis.call('ZADD', K_JOBS, ARGV[8], JOB_ID)
audit('SUBMIT', ARGV[9] or 'CREATED')
if K_CREATE then
  redis.call('HSET', K_CREATE, 'job_id', JOB_ID, 'image_sha', ARGV[6], 'response', ARGV[7])
end
return {'OK', version}

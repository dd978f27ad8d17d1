-- create_job: a new job, its first outbox command (DETECT_SUBJECTS) and events, atomically.
-- KEYS: see _lib.lua; KEYS[17] present when the submitter sent an Idempotency-Key.
-- ARGV[4] plan JSON   ARGV[5] image sha256   ARGV[6] response body   ARGV[7] created_at (ms)
-- Returns {'OK', version} | {'REPLAY', response} | {'IDEMPOTENCY_CONFLICT', existing_job_id} | {'COLLISION'}
if K_CREATE then
  local rec = redis.call('HMGET', K_CREATE, 'job_id', 'image_sha', 'response')
  if rec[1] then
    if rec[2] == ARGV[5] then return {'REPLAY', rec[3]} end
    return {'IDEMPOTENCY_CONFLICT', rec[1]}
  end
end
if redis.call('EXISTS', K_META) == 1 then return {'COLLISION'} end
local version = apply_plan(ARGV[4])
redis.call('ZADD', K_JOBS, ARGV[7], JOB_ID)
if K_CREATE then
  redis.call('HSET', K_CREATE, 'job_id', JOB_ID, 'image_sha', ARGV[5], 'response', ARGV[6])
end
return {'OK', version}

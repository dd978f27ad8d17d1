-- cancel: idempotent. Marks an active pause CANCELLED, ends the job, keeps late reports out,
-- and ends the job's review claim.
-- KEYS: see _lib.lua
-- ARGV[4] version the plan was computed from  ARGV[5] plan JSON
-- Returns {'OK', version} | {'ALREADY', snapshot...} | {'JOB_TERMINAL', snapshot...} | {'JOB_NOT_FOUND'} | {'STALE'}
local m = redis.call('HMGET', K_META, 'status', 'version', 'terminal')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[1] == 'CANCELLED' then return {'ALREADY', snapshot()} end
if m[3] == '1' then return {'JOB_TERMINAL', snapshot()} end
if m[2] ~= ARGV[4] then return {'STALE'} end
local version = apply_plan(ARGV[5])
redis.call('DEL', K_CLAIM)
return {'OK', version}

-- cancel: idempotent. Marks an active pause CANCELLED, ends the job, keeps late reports out,
-- and ends the job's review claim.
-- KEYS: see _lib.lua
-- ARGV[5] version the plan was computed from  ARGV[6] plan JSON
-- ARGV[6] may be '' when the job is already cancelled or ended (the answer needs no plan).
-- Every answer but JOB_NOT_FOUND and STALE appends a CANCEL audit entry: CANCELLED,
-- ALREADY_CANCELLED or REFUSED:JOB_TERMINAL.
-- Returns {'OK', version} | {'ALREADY', snapshot...} | {'JOB_TERMINAL', snapshot...} | {'JOB_NOT_FOUND'} | {'STALE'}
local m = redis.call('HMGET', K_META, 'status', 'version', 'terminal')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[1] == 'CANCELLED' then
  audit('CANCEL', 'ALREADY_CANCELLED')
  return {'ALREADY', snapshot()}
end
if m[3] == '1' then
  audit('CANCEL', 'REFUSED:JOB_TERMINAL')
  return {'JOB_TERMINAL', snapshot()}
end
if m[2] ~= ARGV[5] or ARGV[6] == '' then return {'STALE'} end
local version = apply_plan(ARGV[6])
redis.call('DEL', K_CLAIM)
audit('CANCEL', 'CANCELLED')
return {'OK', version}

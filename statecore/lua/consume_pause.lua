-- consume_pause: the only way a pause is consumed. Checks in docs/protocol.md § Intervention order (3..8), then
-- writes pause CONSUMED, box lists, status, version, outbox command, events and, last,
-- the idempotency record, all in this one script. A consumed pause ends the job's review claim.
-- KEYS: see _lib.lua
-- ARGV[4] intervention_id  ARGV[5] payload hash (body + reviewer)  ARGV[6] base_version
-- ARGV[7] pause_token  ARGV[8] version the plan was computed from  ARGV[9] plan JSON ('' = none)
-- ARGV[10] response body  ARGV[11] message of a 400 found while planning ('' = none)
-- ARGV[12] the snapshot gates' verdict ('' | 'SNAPSHOT_MISMATCH' | 'WORKFLOW_VERSION_INCOMPATIBLE'),
--          decided from the job at version ARGV[8]; for WORKFLOW_VERSION_INCOMPATIBLE, ARGV[9]
--          is the re-offer (a new pause under the current workflow definition)
-- Returns {'OK', version} | {'REPLAY', response} | {CODE, snapshot...} | {'INVALID_REQUEST', msg}
--         | {'JOB_NOT_FOUND'} | {'STALE'}
local rec = redis.call('HGET', K_IDEM, ARGV[4])
if rec then
  local sep = string.find(rec, '\n', 1, true)
  if string.sub(rec, 1, sep - 1) == ARGV[5] then return {'REPLAY', string.sub(rec, sep + 1)} end
  return {'IDEMPOTENCY_CONFLICT', snapshot()}
end
local m = redis.call('HMGET', K_META, 'status', 'version', 'pause_token')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[1] == 'CANCELLED' then return {'JOB_CANCELLED', snapshot()} end
if m[2] ~= ARGV[6] then return {'VERSION_CONFLICT', snapshot()} end
if not m[3] or m[3] == '' then return {'PAUSE_NOT_ACTIVE', snapshot()} end
if m[3] ~= ARGV[7] then return {'PAUSE_TOKEN_MISMATCH', snapshot()} end
if m[2] ~= ARGV[8] then return {'STALE'} end
if ARGV[12] == 'SNAPSHOT_MISMATCH' then return {'SNAPSHOT_MISMATCH', snapshot()} end
if ARGV[12] == 'WORKFLOW_VERSION_INCOMPATIBLE' then
  apply_plan(ARGV[9])
  return {'WORKFLOW_VERSION_INCOMPATIBLE', snapshot()}
end
if ARGV[11] ~= '' then return {'INVALID_REQUEST', ARGV[11]} end
if ARGV[9] == '' then return {'STALE'} end
local version = apply_plan(ARGV[9])
redis.call('HSET', K_IDEM, ARGV[4], ARGV[5] .. '\n' .. ARGV[10])
-- A first intervention that also ends the job (EMPTY_SELECTION) creates K_IDEM after
-- apply_plan set the retention TTLs: give it the same TTL as the job's meta.
keep_ttl_like_meta(K_IDEM)
redis.call('DEL', K_CLAIM)
return {'OK', version}

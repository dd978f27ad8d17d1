-- consume_pause: the only way a pause is consumed. Checks in docs/protocol.md § Intervention order (3..8), then
-- writes pause CONSUMED, box lists, status, version, outbox command, events and, last,
-- the idempotency record, all in this one script. A consumed pause ends the job's review claim.
-- KEYS: see _lib.lua
-- ARGV[5] intervention_id  ARGV[6] payload hash (body + reviewer)  ARGV[7] base_version
-- ARGV[8] pause_token  ARGV[9] version the plan was computed from  ARGV[10] plan JSON ('' = none)
-- ARGV[11] response body  ARGV[12] message of a 400 found while planning ('' = none)
-- ARGV[13] the snapshot gates' verdict ('' | 'SNAPSHOT_MISMATCH' | 'WORKFLOW_VERSION_INCOMPATIBLE'),
--          decided from the job at version ARGV[9]; for WORKFLOW_VERSION_INCOMPATIBLE, ARGV[10]
--          is the re-offer (a new pause under the current workflow definition)
-- ARGV[14] the snapshot_id the audit names: the one the reviewer echoed, else the active pause's
-- ARGV[15] quorum (statecore.quorum): '' (one reviewer) | 'VOTE' (record the vote: the meta's `votes`
--          becomes ARGV[17], a QUORUM_VOTE event with data ARGV[18]; no version, no pause change) |
--          'DECIDE' (apply the plan: the pause consumed, or a reconciliation pause)
-- ARGV[16] the votes the step was computed from: another vote since is STALE (plan again)
-- ARGV[19] the audit entry's action ('' = INTERVENE; QUORUM_VOTE, QUORUM_DISAGREED): the outcome stays
--          ACCEPTED, REPLAYED or REFUSED:<code> as for every intervention (docs/protocol.md § Audit)
-- Every answer but JOB_NOT_FOUND and STALE (nothing was decided: the caller plans again) appends its
-- audit entry: INTERVENE with ACCEPTED, REPLAYED or REFUSED:<code> (docs/protocol.md § Audit).
-- Returns {'OK', version} | {'REPLAY', response} | {CODE, snapshot...} | {'INVALID_REQUEST', msg}
--         | {'JOB_NOT_FOUND'} | {'STALE'}
local BASE, SNAP = ARGV[7], ARGV[14]
local function refused(code)
  audit('INTERVENE', 'REFUSED:' .. code, BASE, SNAP)
  return {code, snapshot()}
end
local rec = redis.call('HGET', K_IDEM, ARGV[5])
local exists = redis.call('EXISTS', K_META) == 1
if rec then
  local sep = string.find(rec, '\n', 1, true)
  if string.sub(rec, 1, sep - 1) == ARGV[6] then
    if exists then audit('INTERVENE', 'REPLAYED', BASE, SNAP) end
    return {'REPLAY', string.sub(rec, sep + 1)}
  end
  if not exists then return {'IDEMPOTENCY_CONFLICT', {}} end
  return refused('IDEMPOTENCY_CONFLICT')
end
local m = redis.call('HMGET', K_META, 'status', 'version', 'pause_token')
if not m[1] then return {'JOB_NOT_FOUND'} end
if m[1] == 'CANCELLED' then return refused('JOB_CANCELLED') end
-- An `any` quorum job (docs/protocol.md § Quorum): a submission on the pause another reviewer's consumed
-- is PAUSE_NOT_ACTIVE, before its (by then stale) base_version is compared.
if m[3] ~= ARGV[8] then
  local policy, gone = redis.call('HGET', K_META, 'policy'), redis.call('HGET', K_PAUSES, ARGV[8])
  if gone and policy and cjson.decode(policy).quorum_policy == 'any' and cjson.decode(gone).status == 'CONSUMED' then
    return refused('PAUSE_NOT_ACTIVE')
  end
end
if m[2] ~= BASE then return refused('VERSION_CONFLICT') end
if not m[3] or m[3] == '' then return refused('PAUSE_NOT_ACTIVE') end
if m[3] ~= ARGV[8] then return refused('PAUSE_TOKEN_MISMATCH') end
if m[2] ~= ARGV[9] then return {'STALE'} end
if ARGV[13] == 'SNAPSHOT_MISMATCH' then return refused('SNAPSHOT_MISMATCH') end
if ARGV[13] == 'WORKFLOW_VERSION_INCOMPATIBLE' then
  apply_plan(ARGV[10])  -- the re-offer: a new pause under the current definition
  return refused('WORKFLOW_VERSION_INCOMPATIBLE')
end
if ARGV[12] ~= '' then
  audit('INTERVENE', 'REFUSED:INVALID_REQUEST', BASE, SNAP)
  return {'INVALID_REQUEST', ARGV[12]}
end
if ARGV[15] ~= '' then
  if (redis.call('HGET', K_META, 'votes') or '') ~= ARGV[16] then return {'STALE'} end
  if ARGV[15] == 'VOTE' then
    redis.call('HSET', K_META, 'votes', ARGV[17])
    append_event('QUORUM_VOTE', m[1], ARGV[18], m[2])
    redis.call('HSET', K_IDEM, ARGV[5], ARGV[6] .. '\n' .. ARGV[11])
    if redis.call('HGET', K_CLAIM, 'reviewer') == ACTOR then redis.call('DEL', K_CLAIM) end
    audit(ARGV[19], 'ACCEPTED', BASE, SNAP)
    return {'OK', m[2]}
  end
end
if ARGV[10] == '' then return {'STALE'} end
local version = apply_plan(ARGV[10])
redis.call('HSET', K_IDEM, ARGV[5], ARGV[6] .. '\n' .. ARGV[11])
-- A first intervention that also ends the job (EMPTY_SELECTION) creates K_IDEM after
-- apply_plan set the retention TTLs: give it the same TTL as the job's meta.
keep_ttl_like_meta(K_IDEM)
redis.call('DEL', K_CLAIM)
audit(ARGV[19] ~= '' and ARGV[19] or 'INTERVENE', 'ACCEPTED', BASE, SNAP)
return {'OK', version}

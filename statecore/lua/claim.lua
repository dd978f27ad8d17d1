-- claim: take, renew, take over or release the review claim of a waiting job (docs/protocol.md § Claims).
-- A claim lives in its own key with a TTL: it never changes the job's meta, version or pause, and
-- its expiry touches nothing else. Only a takeover writes to the job: its CLAIM_TAKEN_OVER event.
-- KEYS: see _lib.lua (K_CLAIM: the claim HASH reviewer, claimed_at, expires_at)
-- ARGV[5] 'claim' | 'release'  ARGV[6] reviewer  ARGV[7] TTL (ms)  ARGV[8] force ('1' | '0')
-- ARGV[9] expires_at (ISO-8601: now + TTL); now (ARGV[2]) is claimed_at of a new claim
-- Audit (docs/protocol.md § Audit): CLAIM with TAKEN, TAKEN_OVER:<holder> or REFUSED:<code>, RELEASE
-- with RELEASED or REFUSED:CLAIMED_BY_OTHER; a renewal by the holder writes nothing (the UI renews
-- every few seconds while the panel is open), nor does releasing no claim.
-- Returns, claim: {'OK', reviewer, claimed_at, expires_at} | {'CLAIMED_BY_OTHER', snapshot, holder, expires_at}
--   | {'JOB_CANCELLED' | 'JOB_TERMINAL' | 'PAUSE_NOT_ACTIVE', snapshot} | {'JOB_NOT_FOUND'}
-- release: {'RELEASED'} | {'NONE'} | {'CLAIMED_BY_OTHER', snapshot, holder, expires_at} | {'JOB_NOT_FOUND'}
local op, reviewer = ARGV[5], ARGV[6]
local m = redis.call('HMGET', K_META, 'status', 'version', 'pause_token', 'terminal')
if not m[1] then return {'JOB_NOT_FOUND'} end
local cur = redis.call('HMGET', K_CLAIM, 'reviewer', 'claimed_at', 'expires_at')
if op == 'release' then
  if not cur[1] then return {'NONE'} end
  if cur[1] ~= reviewer then
    audit('RELEASE', 'REFUSED:CLAIMED_BY_OTHER', m[2])
    return {'CLAIMED_BY_OTHER', snapshot(), cur[1], cur[3]}
  end
  redis.call('DEL', K_CLAIM)
  audit('RELEASE', 'RELEASED', m[2])
  return {'RELEASED'}
end
local function refused(code)
  audit('CLAIM', 'REFUSED:' .. code, m[2])
  return {code, snapshot()}
end
if m[1] == 'CANCELLED' then return refused('JOB_CANCELLED') end
if m[4] == '1' then return refused('JOB_TERMINAL') end
if not m[3] or m[3] == '' then return refused('PAUSE_NOT_ACTIVE') end
local claimed_at = NOW
if cur[1] == reviewer then
  claimed_at = cur[2]  -- a renewal keeps when the claim began
elseif cur[1] then
  if ARGV[8] ~= '1' then
    audit('CLAIM', 'REFUSED:CLAIMED_BY_OTHER', m[2])
    return {'CLAIMED_BY_OTHER', snapshot(), cur[1], cur[3]}
  end
  append_event('CLAIM_TAKEN_OVER', m[1],
    cjson.encode({reviewer = reviewer, from_reviewer = cur[1], from_expires_at = cur[3]}), m[2])
  audit('CLAIM', 'TAKEN_OVER:' .. cur[1], m[2])
else
  audit('CLAIM', 'TAKEN', m[2])
end
redis.call('HSET', K_CLAIM, 'reviewer', reviewer, 'claimed_at', claimed_at, 'expires_at', ARGV[9])
redis.call('PEXPIRE', K_CLAIM, tonumber(ARGV[7]))
return {'OK', reviewer, claimed_at, ARGV[9]}

-- policy_mode: the box auto-approve policy's live mode (statecore.auto_store, docs/learning.md).
-- Standalone (no shared prologue). Both keys carry the same hash tag (one slot on a cluster).
-- KEYS[1] the policy HASH: ref, mode, configured, reason, at, dropped_at
-- KEYS[2] the changes STREAM
-- KEYS[3] the policy's webhook deliveries (STREAM; a drop is queued there only while it exists)
-- ARGV[1] op: 'start'  a process starts with ARGV[3] as its configured mode: it becomes the live mode
--                      when the policy or the configured mode changed since the last start; otherwise
--                      the live one stays (a replica restarting keeps a drop to shadow)
--             'drop'   the live check: shadow, only while ARGV[2] is the policy and it is on
--             'set'    an operator sets ARGV[3] for ARGV[2]
-- ARGV[2] the policy (policy:<name>@<hash>)  ARGV[3] mode  ARGV[4] reason  ARGV[5] at (ISO-8601)
-- ARGV[6] who  ARGV[7] the stream's approximate length cap
-- Returns {'SET' | 'KEPT' | 'DROPPED' | 'NO', live mode}
local cur = redis.call('HMGET', KEYS[1], 'ref', 'mode', 'configured')
local op, ref, mode = ARGV[1], ARGV[2], ARGV[3]
local function log(action, to)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*',
    'action', action, 'policy', ref, 'mode', to, 'reason', ARGV[4], 'by', ARGV[6], 'at', ARGV[5])
end
if op == 'start' then
  if cur[1] == ref and cur[3] == mode and cur[2] then return {'KEPT', cur[2]} end
  redis.call('HSET', KEYS[1], 'ref', ref, 'mode', mode, 'configured', mode, 'reason', ARGV[4], 'at', ARGV[5])
  redis.call('HDEL', KEYS[1], 'dropped_at')
  log('start', mode)
  return {'SET', mode}
elseif op == 'drop' then
  if cur[1] ~= ref or cur[2] ~= 'on' then return {'NO', cur[2] or ''} end
  redis.call('HSET', KEYS[1], 'mode', 'shadow', 'reason', ARGV[4], 'at', ARGV[5], 'dropped_at', ARGV[5])
  log('drop', 'shadow')
  if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then  -- statecore.webhooks: policy.shadow
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'type', 'policy.shadow', 'policy', ref,
      'reason', ARGV[4], 'at', ARGV[5])
  end
  return {'DROPPED', 'shadow'}
end
redis.call('HSET', KEYS[1], 'ref', ref, 'mode', mode, 'reason', ARGV[4], 'at', ARGV[5])
redis.call('HDEL', KEYS[1], 'dropped_at')
if not cur[3] then redis.call('HSET', KEYS[1], 'configured', mode) end
log('set', mode)
return {'SET', mode}

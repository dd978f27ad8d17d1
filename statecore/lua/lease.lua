-- lease: take or renew the inspector lease of one partition. Standalone (no shared prologue).
-- A new holder gets the next fencing token; every inspector verdict carries the lease value and
-- apply_report refuses it once the lease has passed to someone else (docs/protocol.md § Executors
-- and the outbox).
-- KEYS[1] the partition's lease   KEYS[2] the partition's fencing counter (same slot)
-- ARGV[1] owner   ARGV[2] time to live (ms)
-- Returns the lease value "<owner>|<token>" when held by ARGV[1], else nil
local v = redis.call('GET', KEYS[1])
if v then
  if string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return v
  end
  return false
end
local token = redis.call('INCR', KEYS[2])
v = ARGV[1] .. '|' .. token
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return v

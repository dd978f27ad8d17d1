-- reviewer_restore: the archive's copy of the accounts written back to a Redis that lost them all.
-- Standalone. Writes nothing while the accounts HASH exists (its '~' field keeps it even with no
-- account left), so an account removed after the archive was read is never brought back.
-- KEYS[1] the accounts HASH   KEYS[2] the account changes STREAM (see reviewer_add.lua)
-- ARGV[1] at   ARGV[2] the stream's approximate length cap
-- ARGV[3..] five per account: name, token hash, account JSON, role, added by
-- Returns how many accounts were written back (0: the HASH was there)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = 0
for i = 3, #ARGV, 5 do
  redis.call('HSET', KEYS[1], 'n:' .. ARGV[i], ARGV[i + 1], 't:' .. ARGV[i + 1], ARGV[i + 2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
    'action', 'restore', 'name', ARGV[i], 'role', ARGV[i + 3], 'by', 'recovery', 'at', ARGV[1])
  n = n + 1
end
redis.call('HSET', KEYS[1], '~', '1')
return n

-- reviewer_add: a reviewer account, by name, with the SHA-256 of its token (never the token).
-- Standalone (no shared prologue). Both keys carry the same hash tag (one slot on a cluster).
-- KEYS[1] the accounts HASH: "n:<name>" -> token hash; "t:<token hash>" -> account JSON
-- KEYS[2] the account changes STREAM (who added or removed whom, and when)
-- ARGV[1] name   ARGV[2] token hash   ARGV[3] account JSON   ARGV[4] role   ARGV[5] by   ARGV[6] at
-- ARGV[7] the stream's approximate length cap
-- Returns 'OK' | 'NAME_TAKEN' | 'TOKEN_TAKEN'
if redis.call('HEXISTS', KEYS[1], 'n:' .. ARGV[1]) == 1 then return 'NAME_TAKEN' end
if redis.call('HEXISTS', KEYS[1], 't:' .. ARGV[2]) == 1 then return 'TOKEN_TAKEN' end
-- '~': the hash stays while Redis keeps its data, also once the last account is removed: a missing
-- hash means Redis lost it (reviewer_restore.lua then brings the archive's copy back)
redis.call('HSET', KEYS[1], 'n:' .. ARGV[1], ARGV[2], 't:' .. ARGV[2], ARGV[3], '~', '1')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*',
  'action', 'add', 'name', ARGV[1], 'role', ARGV[4], 'by', ARGV[5], 'at', ARGV[6])
return 'OK'

-- reviewer_remove: drop a reviewer account (its name and its token hash together). Standalone.
-- KEYS[1] the accounts HASH   KEYS[2] the account changes STREAM (see reviewer_add.lua)
-- ARGV[1] name   ARGV[2] by   ARGV[3] at   ARGV[4] the stream's approximate length cap
-- Returns the removed account's JSON, or false when no account has that name
local h = redis.call('HGET', KEYS[1], 'n:' .. ARGV[1])
if not h then return false end
local account = redis.call('HGET', KEYS[1], 't:' .. h) or '{}'
redis.call('HDEL', KEYS[1], 'n:' .. ARGV[1], 't:' .. h)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
  'action', 'remove', 'name', ARGV[1], 'role', cjson.decode(account)['role'] or '', 'by', ARGV[2], 'at', ARGV[3])
return account

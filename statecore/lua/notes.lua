-- notes: a reviewer's notes on a job that change nothing of the job itself (docs/protocol.md § Flags,
-- skips and comments): flag it for a lead (with a reason), take the flag off, comment on it, or skip
-- it (release this reviewer's claim; the reviewer's next-job query passes it over for a while).
-- Like a claim, none of them is a change of the job: no version, no pause, no status moves; each is
-- audited in the job's chain, and flags and comments are announced on its events.
-- KEYS: see _lib.lua (KEYS[21], its K_CREATE, is never the creation record here: nothing below uses
-- K_CREATE); KEYS[21] the job's notes (HASH: flag -> JSON, skip:<reviewer> -> until ms),
-- KEYS[22] its comments (LIST of JSON, the last 200)
-- ARGV[5] 'flag' | 'unflag' | 'comment' | 'skip'  ARGV[6] the reason or comment ('' for unflag, skip)
-- ARGV[7] how long the notes are kept (ms, renewed by each note)  ARGV[8] skip: until when (ms)
-- Returns {'OK', version} | {'NONE'} (unflag: no flag) | {'JOB_NOT_FOUND'}
--   | {'JOB_CANCELLED' | 'JOB_TERMINAL' | 'PAUSE_NOT_ACTIVE', snapshot}
local K_NOTES, K_COMMENTS = KEYS[21], KEYS[22]
local op, text, keep_ms = ARGV[5], ARGV[6], tonumber(ARGV[7])
local m = redis.call('HMGET', K_META, 'status', 'version', 'pause_token', 'terminal')
if not m[1] then return {'JOB_NOT_FOUND'} end
local action = ({flag = 'FLAG', unflag = 'UNFLAG', comment = 'COMMENT', skip = 'SKIP'})[op]
local function refused(code)
  audit(action, 'REFUSED:' .. code, m[2])
  return {code, snapshot()}
end
if m[1] == 'CANCELLED' then return refused('JOB_CANCELLED') end
if m[4] == '1' then return refused('JOB_TERMINAL') end
local waiting = m[3] and m[3] ~= ''
if (op == 'flag' or op == 'skip') and not waiting then return refused('PAUSE_NOT_ACTIVE') end
if op == 'flag' then
  local flag = cjson.encode({by = ACTOR, reason = text, at = NOW})
  redis.call('HSET', K_NOTES, 'flag', flag)
  append_event('JOB_FLAGGED', m[1], flag, m[2])
  audit('FLAG', 'FLAGGED:' .. text, m[2])
elseif op == 'unflag' then
  if redis.call('HDEL', K_NOTES, 'flag') == 0 then return {'NONE'} end
  append_event('JOB_UNFLAGGED', m[1], cjson.encode({by = ACTOR}), m[2])
  audit('UNFLAG', 'UNFLAGGED', m[2])
elseif op == 'comment' then
  local comment = cjson.encode({by = ACTOR, text = text, at = NOW})
  redis.call('RPUSH', K_COMMENTS, comment)
  redis.call('LTRIM', K_COMMENTS, -200, -1)
  append_event('COMMENT_ADDED', m[1], comment, m[2])
  audit('COMMENT', 'POSTED:' .. text, m[2])
else
  if redis.call('HGET', K_CLAIM, 'reviewer') == ACTOR then
    redis.call('DEL', K_CLAIM)
    audit('RELEASE', 'RELEASED', m[2])
  end
  redis.call('HSET', K_NOTES, 'skip:' .. ACTOR, ARGV[8])
  audit('SKIP', 'SKIPPED', m[2])
end
redis.call('PEXPIRE', K_NOTES, keep_ms)
if redis.call('EXISTS', K_COMMENTS) == 1 then redis.call('PEXPIRE', K_COMMENTS, keep_ms) end
return {'OK', m[2]}

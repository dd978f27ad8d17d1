-- outbox_sort: the commands of other lanes that an earlier version queued in a partition's one stream
-- (now the detect lane's: docs/protocol.md § Executors and the outbox) and no dispatcher took yet move
-- to their lanes' streams, each in one step (added there, deleted here): a dispatcher's read took an
-- entry before (it stays, delivered: run, or reclaimed, there) or finds it in its lane after, never
-- both. Standalone (no shared prologue): it touches the partition's outbox streams only.
-- KEYS[1] the partition's detect lane   KEYS[2..] its other lanes' streams (the partition's hash tag)
-- ARGV[1] the dispatchers' group   ARGV[2] look at entries after this id   ARGV[3] at most this many
-- ARGV[4..] pairs: a node type that moves, the index in KEYS of its lane's stream
-- Returns {moved, the last id looked at (ARGV[2] when none), how many were looked at}.
local lane = {}
for i = 4, #ARGV, 2 do lane[ARGV[i]] = tonumber(ARGV[i + 1]) end

local function after_id(a, b)  -- whether stream id a comes after b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end

local after = ARGV[2]
local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
if type(groups) == 'table' and groups.err then return {0, after, 0} end  -- no stream: nothing queued
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  -- entries up to the group's last delivered one were taken (pending or acknowledged): they stay
  if f['name'] == ARGV[1] and after_id(f['last-delivered-id'], after) then after = f['last-delivered-id'] end
end

local entries = redis.call('XRANGE', KEYS[1], '(' .. after, '+', 'COUNT', ARGV[3])
local moved, last = 0, after
for _, e in ipairs(entries) do
  last = e[1]
  local fields, cmd = e[2], nil
  for i = 1, #fields, 2 do
    if fields[i] == 'cmd' then cmd = fields[i + 1] end
  end
  local to = cmd and lane[string.match(cmd, '"node_type":"([%w_]+)"') or '']
  if to then
    redis.call('XADD', KEYS[to], '*', unpack(fields))
    redis.call('XDEL', KEYS[1], e[1])
    moved = moved + 1
  end
end
return {moved, last, #entries}

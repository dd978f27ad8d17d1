-- read_counts: one partition's counters for /metrics (statecore.counters.read). Read-only, standalone.
-- KEYS[1] the partition's counts hash
-- ARGV[1] first minute  ARGV[2] last minute of the coverage window  ARGV[3..] plain fields to read (none:
-- the sums alone, as statecore.counters.window_sums asks)
-- Returns the plain fields' values (nil when absent), then the window's sums of the coverage
-- buckets sub, term, wait, ucan: summed here so a scrape sends and parses ~25 values per partition.
local out = {}
if #ARGV > 2 then out = redis.call('HMGET', KEYS[1], unpack(ARGV, 3)) end
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
for _, kind in ipairs({'sub', 'term', 'wait', 'ucan'}) do
  local fields = {}
  for m = first, last do fields[#fields + 1] = kind .. ':' .. m end
  local total = 0
  for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(fields))) do
    if v then total = total + tonumber(v) end
  end
  out[#out + 1] = total
end
return out

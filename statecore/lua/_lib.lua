-- _lib.lua: shared prologue, prepended to every state-changing script at load time.
-- KEYS[1..13] (statecore.keys.JobKeys.for_script, one hash slot):
--   1 meta  2 pauses  3 events (LIST; also the wake-up channel)  4 idem  5 reports  6 outbox  7 waiting  8 running
--   9 jobs  10 expiring (finished jobs by when their records expire)  11 queued  12 heartbeats
--   13 the partition's inspector lease (checked by the inspector's writes: fencing)
-- KEYS[14]    optional: the job's creation idempotency record (same slot)
-- ARGV[1] job_id   ARGV[2] now (ISO-8601)   ARGV[3] retention seconds for finished jobs
-- A "plan" (statecore.decide.Plan.to_json) lists every write of one atomic step;
-- applying it increments the job's version by exactly one.
local K_META, K_PAUSES, K_EVENTS, K_IDEM, K_REPORTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_OUTBOX, K_WAITING, K_RUNNING, K_JOBS, K_EXPIRING = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local K_QUEUED, K_HEARTBEATS, K_LEASE = KEYS[11], KEYS[12], KEYS[13]
local K_CREATE = KEYS[14]
local JOB_ID, NOW, RETENTION = ARGV[1], ARGV[2], tonumber(ARGV[3])

-- An event is one JSON string appended to the job's list (its id is its position);
-- the PUBLISH only wakes SSE readers up, the list is the record.
local function append_event(etype, status, data, version)
  local seq = redis.call('HINCRBY', K_META, 'event_seq', 1)
  redis.call('RPUSH', K_EVENTS, '{"id":' .. seq .. ',"type":"' .. etype .. '","version":' .. version ..
    ',"status":"' .. status .. '","at":"' .. NOW .. '","data":' .. data .. '}')
  redis.call('PUBLISH', K_EVENTS, seq)
  return seq
end

local function snapshot()
  return redis.call('HGETALL', K_META)
end

local function keep_ttl_like_meta(key)
  local ttl = redis.call('PTTL', K_META)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

local function index(key, op)
  if op[1] == 'add' then
    redis.call('ZADD', key, op[2], JOB_ID)
  elseif op[1] == 'del' then
    redis.call('ZREM', key, JOB_ID)
  end
end

local function apply_plan(plan_json)
  local plan = cjson.decode(plan_json)
  local version = redis.call('HINCRBY', K_META, 'version', 1)
  local flat = {}
  for k, v in pairs(plan.meta) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  redis.call('HSET', K_META, unpack(flat))
  for _, ev in ipairs(plan.events) do
    append_event(ev[1], ev[2], ev[3], version)
  end
  if plan.outbox ~= '' then
    redis.call('XADD', K_OUTBOX, '*', 'job', JOB_ID, 'cmd', plan.outbox)
  end
  for token, p in pairs(plan.pauses) do
    redis.call('HSET', K_PAUSES, token, p)
  end
  index(K_WAITING, plan.waiting)
  index(K_RUNNING, plan.running)
  index(K_QUEUED, plan.queued)
  index(K_HEARTBEATS, plan.heartbeats)
  if plan.terminal and RETENTION > 0 then
    for _, k in ipairs({K_META, K_PAUSES, K_EVENTS, K_IDEM, K_REPORTS}) do
      redis.call('EXPIRE', k, RETENTION)
    end
    if K_CREATE then redis.call('EXPIRE', K_CREATE, RETENTION) end
    -- The listing index has no TTL of its own: record when this job's records go, for pruning.
    local t = redis.call('TIME')
    redis.call('ZADD', K_EXPIRING, t[1] * 1000 + math.floor(t[2] / 1000) + RETENTION * 1000, JOB_ID)
  end
  return version
end


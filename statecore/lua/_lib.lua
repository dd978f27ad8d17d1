-- _lib.lua: shared prologue, prepended to every state-changing script at load time.
-- KEYS[1..16] (statecore.keys.JobKeys.for_script, one hash slot):
--   1 meta  2 pauses  3 events (LIST; also the wake-up channel)  4 idem  5 reports  6 outbox (detect lane)  7 waiting  8 running
--   9 jobs  10 expiring (finished jobs by when their records expire)  11 queued  12 heartbeats
--   13 the partition's inspector lease (checked by the inspector's writes: fencing)
--   14 the partition's counters (HASH, statecore.counters): one field per status, cumulative
--      totals, and per-minute coverage buckets of the jobs submitted in that minute
--   15 the partition's finished jobs' final statuses (HASH job_id -> status, until pruned)
--   16 the job's review claim (HASH with a TTL; never part of the job's version: claim.lua)
--   17 the job's audit log (LIST, a hash chain: audit() below; docs/protocol.md § Audit)
--   18 the partition's archive stream (archive commands, apart from the node commands' outbox)
--   19 the partition's jobs waiting for their archive copy (ZSET job_id -> when queued, ms)
-- KEYS[20]    the partition's webhook deliveries (STREAM; written only while it exists: statecore.webhooks)
-- KEYS[21]    optional: the job's creation idempotency record (same slot)
-- ARGV[1] job_id   ARGV[2] now (ISO-8601)   ARGV[3] retention seconds for finished jobs
-- ARGV[4] the actor the audit names (the token's name, or the process acting: dispatcher, inspector)
-- A "plan" (statecore.decide.Plan.to_json) lists every write of one atomic step;
-- applying it increments the job's version by exactly one.
local K_META, K_PAUSES, K_EVENTS, K_IDEM, K_REPORTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_OUTBOX, K_WAITING, K_RUNNING, K_JOBS, K_EXPIRING = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local K_QUEUED, K_HEARTBEATS, K_LEASE = KEYS[11], KEYS[12], KEYS[13]
local K_COUNTS, K_FINISHED, K_CLAIM = KEYS[14], KEYS[15], KEYS[16]
local K_AUDIT, K_ARCHIVE, K_ARCHIVE_WAITING, K_WEBHOOKS, K_CREATE = KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[21]
local JOB_ID, NOW, RETENTION, ACTOR = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
-- ARGV[4] may carry, after a NUL, the audit entry's intent fields as a JSON object (statecore.audit.actor_arg):
-- role, proxy_user, intervention_id, payload_hash, node, reason. ACTOR is the name alone.
local INTENT = nil
do
  local name, fields = string.match(ARGV[4] or '', '^(.*)%z({.*})$')
  if name then ACTOR, INTENT = name, cjson.decode(fields) end
end
local INTENT_FIELDS = {'role', 'proxy_user', 'intervention_id', 'payload_hash', 'node', 'reason'}

-- Audit (docs/protocol.md § Audit). An entry's hashed fields, in statecore.audit.HASHED order:
-- seq, at, actor, action, base_version, snapshot_id, outcome, prev_hash; `hash` is SHA-1 (the
-- one digest Redis's Lua has) over them, each written as <length>:<text> ('-' for none), so no two
-- entries share a hashed text, followed, when the action carries any, by the INTENT fields in
-- statecore.audit.INTENT order (an entry without them hashes as it did before they existed).
-- `prev_hash` is read here from the head kept in
-- the meta (audit_head, audit_seq), inside the script that commits the action: an append can only
-- extend the current head, the chain cannot fork. statecore.audit.verify recomputes it, so both
-- write the same bytes: <length> counts bytes (Lua's #; Python counts the UTF-8 encoding), and every
-- number reaches canon as its digits (seq stays far below 1e14, where tostring would use an exponent).
local function canon(v)
  if v == nil or v == cjson.null or v == '' then return '-' end
  local s = tostring(v)
  return #s .. ':' .. s
end

-- A version as the client sent it: a JSON number while cjson writes it digit for digit (it writes
-- numbers with 14 significant digits: 123456789012345 would be stored 1.2345678901234e+14, and the
-- hash covers the digits), else its digits as text (statecore.audit.parse reads both as the integer).
local function version_value(v)
  if v == nil or v == '' then return cjson.null end
  if #v <= 14 and string.match(v, '^%d+$') then return tonumber(v) end
  return v
end

-- Server time in ms.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The job's archive command (docs/protocol.md § Archive), into its partition's archive stream (not
-- the outbox: the archivers read it, never a node dispatcher), and the job into the index of jobs
-- waiting for their copy (the archivers' sweep re-queues one whose command was lost). The meta's
-- 'archive_queued' (ms) says one is on its way until archive_ack.lua acknowledges a copy: entries
-- gained meanwhile ride on it (a copy that missed them is STALE and made again), so a finished job
-- refusing a burst of replays is copied once, not once per refusal. After ARCHIVE_REQUEUE_MS an
-- entry queues a new one anyway.
local ARCHIVE_REQUEUE_MS = 60000
local ARCHIVE_QUEUED = false
local function queue_archive(version)
  local now = now_ms()
  redis.call('XADD', K_ARCHIVE, '*', 'job', JOB_ID, 'version', version, 'at', NOW)
  redis.call('ZADD', K_ARCHIVE_WAITING, now, JOB_ID)
  redis.call('HSET', K_META, 'archive_queued', now)
  ARCHIVE_QUEUED = true
end

local function audit(action, outcome, base_version, snapshot_id)
  local head = redis.call('HMGET', K_META, 'audit_head', 'audit_seq')
  local prev = head[1] or ''
  local seq = (tonumber(head[2]) or 0) + 1
  local bv = base_version or ''
  local sid = snapshot_id or ''
  local text = canon(seq) .. canon(NOW) .. canon(ACTOR) .. canon(action) .. canon(bv) ..
    canon(sid) .. canon(outcome) .. canon(prev)
  local intent = nil
  if INTENT then
    for _, f in ipairs(INTENT_FIELDS) do
      if canon(INTENT[f]) ~= '-' then intent = INTENT break end
    end
  end
  if intent then
    for _, f in ipairs(INTENT_FIELDS) do text = text .. canon(intent[f]) end
  end
  local hash = redis.sha1hex(text)
  -- Stored compact (statecore.audit.STORED): no prev_hash (the hash of the entry before it: the
  -- reader fills it in), base_version and snapshot_id left out when none, then the intent object.
  local stored = {seq, NOW, ACTOR, action, outcome, hash}
  if bv ~= '' or sid ~= '' or intent then stored[7] = version_value(bv) end
  if sid ~= '' or intent then stored[8] = sid ~= '' and sid or cjson.null end
  if intent then stored[9] = intent end
  redis.call('RPUSH', K_AUDIT, cjson.encode(stored))
  redis.call('HSET', K_META, 'audit_head', hash, 'audit_seq', seq)
  local ttl = redis.call('PTTL', K_META)
  if ttl > 0 then redis.call('PEXPIRE', K_AUDIT, ttl) end
  -- A finished job that gains an entry (a refused action, a late report) is copied again, so the
  -- archive holds everything before its Redis records expire.
  if not ARCHIVE_QUEUED then
    local f = redis.call('HMGET', K_META, 'terminal', 'archive', 'version', 'archive_queued')
    if f[1] == '1' and f[2] == '1' and (not f[4] or now_ms() - tonumber(f[4]) >= ARCHIVE_REQUEUE_MS) then
      queue_archive(f[3])
    end
  end
  return seq
end

-- An event is one JSON string appended to the job's list; its id is event_seq, and its position in
-- the list is id - event_base (event_base: 0, or for a restored job the id just before the first
-- event its new list holds: restore_job.lua). The PUBLISH only wakes SSE readers up, the list is the record.
-- An event a webhook is for (docs/protocol.md § Webhooks) is also queued, in the same step, in the
-- partition's webhook stream, while that stream exists (a deliverer made its group there: webhooks
-- are configured); the cap bounds a backlog nobody delivers. A pause's data (its box list, maybe
-- "@meta") is left out: the receiver reads the job (GET /jobs/{id}), small deliveries stay small.
local WEBHOOK_TYPES = {PAUSE_OPENED = 'review.waiting', JOB_FINISHED = 'job.finished'}
local WEBHOOK_CAP = 10000
local function queue_webhook(etype, seq, status, data, version)
  local hook = WEBHOOK_TYPES[etype]
  if not hook or redis.call('EXISTS', K_WEBHOOKS) == 0 then return end
  if etype == 'PAUSE_OPENED' then data = '{}' end
  redis.call('XADD', K_WEBHOOKS, 'MAXLEN', '~', WEBHOOK_CAP, '*', 'type', hook, 'job', JOB_ID, 'event', seq,
    'status', status, 'version', version, 'at', NOW, 'data', data)
end

local function append_event(etype, status, data, version)
  local seq = redis.call('HINCRBY', K_META, 'event_seq', 1)
  redis.call('RPUSH', K_EVENTS, '{"id":' .. seq .. ',"type":"' .. etype .. '","version":' .. version ..
    ',"status":"' .. status .. '","at":"' .. NOW .. '","data":' .. data .. '}')
  redis.call('PUBLISH', K_EVENTS, seq)
  queue_webhook(etype, seq, status, data, version)
  return seq
end

-- A PAUSE_OPENED event may be stored with "data":"@meta": its data is the meta's active_pause and
-- box_list, byte for byte (statecore/eventrefs.py), its id in the meta's 'pause_event'. Before a plan
-- changes either field, the event is written out in full from the meta as it still is, so the
-- reference always means what the pause opened with.
local DATA_REF = '"data":"@meta"}'
local function settle_pause_event(meta_changes)
  if meta_changes.active_pause == nil and meta_changes.box_list == nil then return end
  local ref = redis.call('HMGET', K_META, 'pause_event', 'event_base')
  local id = tonumber(ref[1] or '')
  if not id then return end
  local pos = id - (tonumber(ref[2] or '') or 0) - 1  -- the event's place in the list (0-based)
  local raw = pos >= 0 and redis.call('LINDEX', K_EVENTS, pos) or nil
  if raw and string.sub(raw, -#DATA_REF) == DATA_REF then
    local m = redis.call('HMGET', K_META, 'active_pause', 'box_list')
    local members = {}  -- a field missing from the meta (removed by hand) is left out
    if m[1] and m[1] ~= '' then members[#members + 1] = '"active_pause":' .. m[1] end
    if m[2] and m[2] ~= '' then members[#members + 1] = '"box_list":' .. m[2] end
    redis.call('LSET', K_EVENTS, pos, string.sub(raw, 1, #raw - #DATA_REF) ..
      '"data":{' .. table.concat(members, ',') .. '}}')
  end
  redis.call('HDEL', K_META, 'pause_event')
end

local function snapshot()
  return redis.call('HGETALL', K_META)
end

local function keep_ttl_like_meta(key)
  local ttl = redis.call('PTTL', K_META)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

-- A finished job's records expire after the retention; the listing index has no TTL of its own:
-- record when this job's records go, for pruning.
local function start_retention()
  for _, k in ipairs({K_META, K_PAUSES, K_EVENTS, K_IDEM, K_REPORTS, K_AUDIT}) do
    redis.call('EXPIRE', k, RETENTION)
  end
  if K_CREATE then redis.call('EXPIRE', K_CREATE, RETENTION) end
  redis.call('ZADD', K_EXPIRING, now_ms() + RETENTION * 1000, JOB_ID)
end

local function index(key, op, member)
  if op[1] == 'add' then
    redis.call('ZADD', key, op[2], member or JOB_ID)
  elseif op[1] == 'del' then
    redis.call('ZREM', key, member or JOB_ID)
  end
end

-- A job's live SEGMENT_SUBJECT nodes (statecore.subjects, statecore.keys.node_field): meta fields
-- 'node:<id>', and in the queued, running and heartbeat indices the members '<job_id>|<id>'.
local NODE_FIELD = 'node:'
local function is_live_node(current_id, nid)
  return current_id == nid or redis.call('HEXISTS', K_META, NODE_FIELD .. nid) == 1
end

-- The index member of node `nid`: its own while it is a live subject node, else the job's.
local function node_member(nid)
  if redis.call('HEXISTS', K_META, NODE_FIELD .. nid) == 1 then return JOB_ID .. '|' .. nid end
  return JOB_ID
end

-- A finished job's subject nodes leave the indices (their fields stay, as the plan marked them: a
-- cancel's CANCELLED; a late report of one is ignored, the job being terminal).
local function unindex_subject_nodes()
  for _, f in ipairs(redis.call('HKEYS', K_META)) do
    if string.sub(f, 1, #NODE_FIELD) == NODE_FIELD then
      local member = JOB_ID .. '|' .. string.sub(f, #NODE_FIELD + 1)
      for _, key in ipairs({K_QUEUED, K_RUNNING, K_HEARTBEATS}) do redis.call('ZREM', key, member) end
    end
  end
end

-- Counters (statecore/counters.py reads them; keep the two status sets equal to statecore.states).
local TERMINAL = {SUCCEEDED = true, PARTIAL_SUCCEEDED = true, FAILED = true, EMPTY_SELECTION = true,
  CANCELLED = true, TIMED_OUT = true}
local WAITING = {WAITING_USER_SELECTION = true, WAITING_BOX_BATCH_REVISION = true, WAITING_MASK_REVIEW = true}
local MINUTE_MS = 60000
local HORIZON = 360 -- minutes of coverage buckets kept: the longest --coverage-window-s (6 h)

-- Coverage buckets: fields '<kind>:<minute>' (minute = the job's created_at ms // 60000) for
-- kind sub (submitted), term (terminal, not cancelled), wait (waiting on a person now), ucan
-- (cancelled by a user). 'bucket:last' is the newest minute seen: every bucket lies in
-- (last - HORIZON, last], so entering a new minute deletes the ones that fell out (at most
-- HORIZON minutes' fields, once per minute per partition).
local BUCKET_KINDS = {'sub', 'term', 'wait', 'ucan'}
local function open_bucket(minute)
  local last = tonumber(redis.call('HGET', K_COUNTS, 'bucket:last') or '')
  if last == nil then
    redis.call('HSET', K_COUNTS, 'bucket:last', minute)
  elseif minute > last then
    redis.call('HSET', K_COUNTS, 'bucket:last', minute)
    local old = {}
    for m = math.max(last - HORIZON + 1, 0), math.min(last, minute - HORIZON) do
      for _, kind in ipairs(BUCKET_KINDS) do old[#old + 1] = kind .. ':' .. m end
    end
    if #old > 0 then redis.call('HDEL', K_COUNTS, unpack(old)) end
  elseif minute <= last - HORIZON then
    return false -- older than every bucket kept (a clock far behind): not counted
  end
  redis.call('HINCRBY', K_COUNTS, 'sub:' .. minute, 1)
  return true
end

-- The job's status moved from `old` (nil: created now) to `new`; `created_ms`: its created_at.
local function count_status(old, new, created_ms)
  local bucket = nil
  if old == nil then
    redis.call('HINCRBY', K_COUNTS, 'submitted', 1)
    local minute = math.floor(created_ms / MINUTE_MS)
    if open_bucket(minute) then bucket = minute end
  elseif old == new then
    return
  else
    redis.call('HINCRBY', K_COUNTS, old, -1)
    local score = redis.call('ZSCORE', K_JOBS, JOB_ID)
    if score then
      local minute = math.floor(tonumber(score) / MINUTE_MS)
      if redis.call('HEXISTS', K_COUNTS, 'sub:' .. minute) == 1 then bucket = minute end
    end
  end
  redis.call('HINCRBY', K_COUNTS, new, 1)
  local waiting = (WAITING[new] and 1 or 0) - ((old and WAITING[old]) and 1 or 0)
  if waiting ~= 0 and bucket then redis.call('HINCRBY', K_COUNTS, 'wait:' .. bucket, waiting) end
  if TERMINAL[new] and not (old and TERMINAL[old]) then
    redis.call('HINCRBY', K_COUNTS, 'finished', 1)
    local kind = 'term'
    if new == 'CANCELLED' then
      redis.call('HINCRBY', K_COUNTS, 'user_cancelled', 1)
      kind = 'ucan'
    end
    if bucket then redis.call('HINCRBY', K_COUNTS, kind .. ':' .. bucket, 1) end
  end
end

-- The box auto-approve policy's decisions and the reviews of them (statecore.auto_plan), per policy:
-- fields '<policy:name@hash>:<counter>' (and '_fa' / '_agree' / '_would' when the event says so), read
-- back by statecore.auto_store (the live spot-check false-accept rate, the shadow agreement).
local POLICY_COUNTED = {AUTO_APPROVED = 'auto', POLICY_SHADOW_DECISION = 'shadow', POLICY_SPOT_CHECKED = 'spot',
  POLICY_SHADOW_COMPARED = 'shadow_reviewed', POLICY_REVIEW_COMPARED = 'reviewed'}
local function count_policy(counter, data)
  local d = cjson.decode(data)
  local base = tostring(d.policy) .. ':' .. counter
  redis.call('HINCRBY', K_COUNTS, base, 1)
  if d.false_accept == true then redis.call('HINCRBY', K_COUNTS, base .. '_fa', 1) end
  if d.agreed == true then redis.call('HINCRBY', K_COUNTS, base .. '_agree', 1) end
  if d.would_approve == true then redis.call('HINCRBY', K_COUNTS, base .. '_would', 1) end
end

-- Node attempts: every NODE_STARTED, those with attempt > 1 (retries), and applied results.
local function count_event(etype, data)
  if etype == 'NODE_STARTED' then
    redis.call('HINCRBY', K_COUNTS, 'node_starts', 1)
    if (tonumber(cjson.decode(data).attempt) or 1) > 1 then
      redis.call('HINCRBY', K_COUNTS, 'node_retries', 1)
    end
  elseif etype == 'NODE_COMPLETED' then
    redis.call('HINCRBY', K_COUNTS, 'node_results', 1)
  elseif POLICY_COUNTED[etype] then
    count_policy(POLICY_COUNTED[etype], data)
  elseif etype == 'GATE_SPOT_CHECKED' then
    -- A person's decision on a mask the gate passed (statecore.gate_spot): 'gate_spot', '_fa' when not accepted.
    redis.call('HINCRBY', K_COUNTS, 'gate_spot', 1)
    if cjson.decode(data).false_accept == true then redis.call('HINCRBY', K_COUNTS, 'gate_spot_fa', 1) end
  end
end

-- While subjects are cut, each one's result has a field of its own, 'result:<box_id>', and
-- 'subjects_live' counts the 'node:*' fields (statecore.keys; subject_write.lua writes only those).
-- A plan that writes the whole 'results' list was planned from the assembled list: the own fields are
-- folded into it (dropped; the plan writes again those of the subjects still being cut). Returns
-- whether the plan adds or removes a subject node (the count is then taken again, after it).
local RESULT_FIELD = 'result:'
local function fold_subject_results(meta)
  local fold = meta.results ~= nil and meta.results ~= cjson.null
  local nodes = false
  for k, _ in pairs(meta) do
    if string.sub(k, 1, #NODE_FIELD) == NODE_FIELD then nodes = true break end
  end
  if fold then
    local own = {}
    for _, f in ipairs(redis.call('HKEYS', K_META)) do
      if string.sub(f, 1, #RESULT_FIELD) == RESULT_FIELD then own[#own + 1] = f end
    end
    if #own > 0 then redis.call('HDEL', K_META, unpack(own)) end
  end
  return nodes
end

local function count_subject_nodes()
  local n = 0
  for _, f in ipairs(redis.call('HKEYS', K_META)) do
    if string.sub(f, 1, #NODE_FIELD) == NODE_FIELD then n = n + 1 end
  end
  if n > 0 then redis.call('HSET', K_META, 'subjects_live', n) else redis.call('HDEL', K_META, 'subjects_live') end
end

local function apply_plan(plan_json)
  local plan = cjson.decode(plan_json)
  -- Read before the first write: no status yet means this plan creates the job (only
  -- create_job.lua does, whose ARGV[8] is the created_at ms it also indexes the job under).
  local old_status = redis.call('HGET', K_META, 'status') or nil
  local version = redis.call('HINCRBY', K_META, 'version', 1)
  local flat = {}
  local gone = {}
  for k, v in pairs(plan.meta) do
    if v == cjson.null then  -- a field the plan removes (a finished node's input)
      gone[#gone + 1] = k
    else
      flat[#flat + 1] = k
      flat[#flat + 1] = v
    end
  end
  settle_pause_event(plan.meta)
  local recount = fold_subject_results(plan.meta)
  redis.call('HSET', K_META, unpack(flat))
  if #gone > 0 then redis.call('HDEL', K_META, unpack(gone)) end
  if recount then count_subject_nodes() end
  for _, ev in ipairs(plan.events) do
    local seq = append_event(ev[1], ev[2], ev[3], version)
    count_event(ev[1], ev[3])
    if ev[1] == 'PAUSE_OPENED' and ev[3] == '"@meta"' then redis.call('HSET', K_META, 'pause_event', seq) end
  end
  if plan.meta.status then
    count_status(old_status, plan.meta.status, old_status == nil and tonumber(ARGV[8]) or 0)
  end
  for _, cmd in ipairs(plan.outbox) do
    -- {stream, command}: the command's lane of this partition (statecore.keys.command_outbox); every
    -- lane's stream carries the partition's hash tag, like K_OUTBOX (the detect lane): same slot.
    if string.sub(cmd[1], 1, #K_OUTBOX) ~= K_OUTBOX then error('OUTBOX_NOT_OF_PARTITION ' .. cmd[1]) end
    redis.call('XADD', cmd[1], '*', 'job', JOB_ID, 'cmd', cmd[2])
  end
  for token, p in pairs(plan.pauses) do
    redis.call('HSET', K_PAUSES, token, p)
  end
  index(K_WAITING, plan.waiting)
  index(K_RUNNING, plan.running)
  index(K_QUEUED, plan.queued)
  index(K_HEARTBEATS, plan.heartbeats)
  local member_index = {queued = K_QUEUED, running = K_RUNNING, heartbeats = K_HEARTBEATS}
  for _, m in ipairs(plan.members) do
    index(member_index[m[1]], {m[2], m[3]}, JOB_ID .. '|' .. m[4])
  end
  if plan.terminal then unindex_subject_nodes() end
  if plan.terminal and plan.archive then
    -- Archived first (docs/protocol.md § Archive): the records get their retention only when
    -- the archive acknowledged the copy (archive_ack.lua). Same slot: the partition's archive stream.
    -- 'archive' in the meta: later entries of the finished job are copied too (audit()).
    queue_archive(version)
    redis.call('HSET', K_META, 'archive', '1')
    redis.call('HSET', K_FINISHED, JOB_ID, plan.meta.status)
  elseif plan.terminal and RETENTION > 0 then
    start_retention()
    -- Its meta is gone by the time pruning drops it: keep the final status to uncount it then.
    redis.call('HSET', K_FINISHED, JOB_ID, plan.meta.status)
  end
  return version
end


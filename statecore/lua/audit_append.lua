-- audit_append: an audit entry for an action decided before any other script ran (an intervention
-- refused as a 400 from its boxes and the job alone, a dead-letter command put back in the outbox).
-- The entry joins the chain exactly as the other scripts' do (audit() in _lib.lua).
-- KEYS: see _lib.lua
-- ARGV[5] action  ARGV[6] outcome  ARGV[7] base_version ('' = none)  ARGV[8] snapshot_id ('' = none)
-- Returns 1 (appended) | 0 (Redis does not hold the job: nothing to append to)
if redis.call('EXISTS', K_META) == 0 then return 0 end
audit(ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return 1

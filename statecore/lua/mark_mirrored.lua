-- mark_mirrored: the live mirror holds the job at version ARGV[1] (archive/journal.py, after its
-- database commit). Sets the meta's 'mirrored' to it, never backwards, and only while the job is
-- there at that version or later (it never creates a meta Redis lost). Not a change of the job: its
-- version does not move.
-- KEYS[1] the job's meta
-- Returns 1 when it moved 'mirrored', else 0
local m = redis.call('HMGET', KEYS[1], 'version', 'mirrored')
local v = tonumber(ARGV[1])
if not m[1] or tonumber(m[1]) < v or (tonumber(m[2] or '') or -1) >= v then return 0 end
redis.call('HSET', KEYS[1], 'mirrored', v)
return 1

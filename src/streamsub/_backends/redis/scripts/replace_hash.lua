-- Replace a hash's contents in one step (labels): DEL, then HSET.
-- KEYS[1]: the hash. ARGV: field, value, ... (none: the hash is deleted).
redis.call('DEL', KEYS[1])
if #ARGV > 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return 1

-- Store a record hash unless one exists: the check and the write are one step,
-- so two creators racing see one winner.
-- KEYS[1]: the record. ARGV: field, value, ...
-- Returns nil when created, else the stored fields (HGETALL).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HGETALL', KEYS[1])
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return false

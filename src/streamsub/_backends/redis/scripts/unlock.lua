-- Give back a lock only if the caller still holds it (its token is the value):
-- a holder whose lock expired must not delete the next holder's.
-- KEYS[1]: the lock. ARGV[1]: the token. Returns 1 when deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

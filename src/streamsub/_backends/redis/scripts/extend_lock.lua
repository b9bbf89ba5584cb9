-- Extend a lock only if the caller still holds it (its token is the value), so
-- a long pass keeps its lock and a holder whose lock expired cannot extend
-- the next holder's.
-- KEYS[1]: the lock. ARGV[1]: the token, ARGV[2]: the new expiry (ms).
-- Returns 1 when extended, 0 when the caller no longer holds the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

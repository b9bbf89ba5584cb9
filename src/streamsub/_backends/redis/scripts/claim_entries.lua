-- Claim entries of a stream for one replay, in one step, so that two replays
-- running at once (or a retry) never both publish the same entry.
-- KEYS[1]: the stream, KEYS[2]: its claims (a hash: entry id -> expiry, server ms).
-- ARGV[1]: how long a claim lasts (ms), ARGV[2..]: the entry ids.
-- An id is won when its entry still exists and nobody holds a live claim on
-- it; a claim whose holder crashed expires, and the entry can be won again.
-- Returns the ids won.
local key, claims, ttl = KEYS[1], KEYS[2], tonumber(ARGV[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local won = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local held = tonumber(redis.call('HGET', claims, id) or '0')
  if held <= now and #redis.call('XRANGE', key, id, id) > 0 then
    redis.call('HSET', claims, id, string.format('%d', now + ttl))
    won[#won + 1] = id
  end
end
-- Every live claim ends within ttl: so may the hash, whatever is left in it.
if #won > 0 then redis.call('PEXPIRE', claims, ttl) end
return won

-- Claim entries idle for at least min-idle (a crashed or slow consumer's, or
-- nacked ones) for this consumer, with their exact delivery counts.
-- KEYS[1]: the stream. ARGV: group, consumer, min-idle ms, cursor, count.
-- Returns {next cursor, entries, delivery counts, ids of entries that were
-- pending but no longer exist (trimmed: lost, and now removed from the PEL)}.
local key, group = KEYS[1], ARGV[1]
local reply = redis.call('XAUTOCLAIM', key, group, ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local entries, counts, deleted = {}, {}, reply[3] or {}
for _, entry in ipairs(reply[2]) do
  if entry[2] then
    local pending = redis.call('XPENDING', key, group, entry[1], entry[1], 1)
    entries[#entries + 1] = entry
    counts[#counts + 1] = pending[1] and pending[1][4] or 1
  else
    -- Redis 6.2 keeps a trimmed entry in the PEL and returns it without fields.
    redis.call('XACK', key, group, entry[1])
    deleted[#deleted + 1] = entry[1]
  end
end
return {reply[1], entries, counts, deleted}

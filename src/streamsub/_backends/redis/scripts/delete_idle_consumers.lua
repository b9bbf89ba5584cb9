-- Delete consumers of a group that hold nothing and have been idle for long.
-- A consumer with pending entries is never deleted: XGROUP DELCONSUMER would
-- drop its entries from the PEL, and they would never be redelivered.
-- KEYS[1]: the stream. ARGV: group, minimum idle ms, the calling consumer
-- (never deleted: it is alive, only blocked in a read). Returns the names deleted.
local deleted = {}
for _, info in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local fields = {}
  for i = 1, #info, 2 do fields[info[i]] = info[i + 1] end
  if fields['pending'] == 0 and fields['idle'] >= tonumber(ARGV[2])
      and fields['name'] ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    deleted[#deleted + 1] = fields['name']
  end
end
return deleted

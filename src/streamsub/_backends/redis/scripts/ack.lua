-- Acknowledge many entries of one partition, and drop the delivery-time
-- records of redelivered ones. KEYS[1]: the stream, KEYS[2]: the records.
-- ARGV: group, ids separated by spaces, ids whose records go (same form).
-- Returns how many entries were pending.
-- Ids come as one argument: packing thousands of arguments one by one costs
-- the Python client more than the acknowledgement costs Redis.
local key, times, group = KEYS[1], KEYS[2], ARGV[1]
local function each_chunk(text, call)
  local chunk, n, total = {}, 0, 0
  for id in string.gmatch(text, '%S+') do
    n = n + 1
    chunk[n] = id
    if n == 500 then
      total = total + call(chunk)
      chunk, n = {}, 0
    end
  end
  if n > 0 then total = total + call(chunk) end
  return total
end
local acked = each_chunk(ARGV[2], function(ids)
  return redis.call('XACK', key, group, unpack(ids))
end)
each_chunk(ARGV[3], function(ids)
  return redis.call('HDEL', times, unpack(ids))
end)
return acked

-- Sluice: one atomic decision over all the limits of a policy for one key.
--
-- Mirrors crates/sluice-core/src/algorithms.rs and evaluate.rs field for field; a differential
-- test holds the two identical. Loaded once, either as a Redis Function library (FUNCTION LOAD;
-- functions __LIB___check, __LIB___peek, __LIB___refund, __LIB___acquire, __LIB___hold,
-- __LIB___release, and the lean ones __LIB___rate, __LIB___rate_ro and __LIB___batch) or as
-- one script per operation for EVALSHA whose last line calls `run` with the operation.
-- `__LIB__` is replaced by the library's versioned name when loaded.
--
-- Checks and peeks of policies without a concurrency limit take the lean path (`rate`, its
-- layout documented in its own section below) or, coalesced, a `batch`; every other operation
-- takes the general path, whose layout follows.
--
-- KEYS[i]   the state of limit i of the policy, in the policy's order (`acquire` adds the
--           holders set; a policy with a concurrency limit adds that limit's units hash,
--           always last). All share one hash tag, so the script runs on Redis Cluster too
--           (keys.rs names them).
-- ARGV[1]   now in ms since the epoch, or "redis" to read Redis TIME inside the script
-- ARGV[2]   cost (0 to 2^53)
-- ARGV[3]   expiry margin in ms: a key expires this long after its state stops mattering
-- ARGV[4]   n, the number of limits (#KEYS less the keys added above)
-- then 9 values per limit i, from 5 + 9*(i-1) (listed below),
-- and for `acquire` only, ARGV[5 + 9*n]: the most units to take (the cost is the least),
-- ARGV[6 + 9*n] the holder id ("0": anonymous) and ARGV[7 + 9*n] how long (ms) a holder
-- counts after its last acquire; KEYS[n + 1] is then the key's holders set (a sorted set:
-- member holder id, score the instant it stops counting).
-- For `hold` and `release` only, ARGV[5 + 9*n] is the lease id (a decimal u64, kept a string:
-- a Lua number would round it).
--   algorithm  1 fixed_window, 2 fixed_window aligned, 3 sliding_window, 4 token_bucket,
--              5 concurrency (per: the lease TTL)
--   max, per (ms), precision (ms; sliding), burst (bucket)
--   tau_ms, tau_frac    (bucket) burst*per/max as whole ms + a numerator over max
--   step_ms, step_frac  (bucket) cost*per/max likewise (`acquire`: 1*per/max, scaled here)
-- The Rust caller computes tau and step exactly (128-bit); Lua numbers are doubles, exact only
-- up to 2^53, so every computation below stays under 2^53 or is split into 16-bit limbs.
--
-- Stored state (hashes, but for the concurrency limit's own key and a fixed window's counter):
--   fixed_window    KEYS[i] = <stem>:fw<per>:c<ARGV[3]> (the margin in ms, as sent, is in
--                   the name: no process reads a window with another margin than it was
--                   written with), in one of two encodings chosen when the window opens (see
--                   "fixed windows" below): a counter, a string integer `used` whose absolute
--                   expiry (SET PXAT) is the window's end + margin, so reset = PEXPIRETIME -
--                   margin; or, opened by a caller whose clock is off Redis's by half the
--                   margin or more, a hash: reset, used (reset stored when the window opens,
--                   never recomputed; PEXPIRE reset - now + margin). Every path reads both.
--   sliding_window  <bucket start> -> n (one field per non-empty bucket)
--   token_bucket    tat, frac           (theoretical arrival time = tat + frac/max ms)
--   concurrency     a sorted set, member lease id, score its expiry; and the units hash,
--                   <lease id> -> cost, and used (the total cost of the leases in the set).
--                   Lapsed leases are not counted by any read (only they are read: a decision
--                   never reads the whole set) and are deleted by the next write.
-- Key expiry (PEXPIRE, relative to `now`, + margin) only cleans up: every read compares the
-- stored times with `now`, so a closed window that still exists is treated as closed. A
-- fixed window's counter is the exception: its absolute expiry is its end.
--
-- Reply: { allowed (0/1), now, then per limit: admits (0/1), remaining, reset_ms,
--          retry_after_ms (-1 = never) }; `acquire` appends the amount it decided on and
--          the number of holders counting (this one included; 0 when anonymous); `release`
--          appends the units the lease held (0: not held).

-- Redis loads a function library in a sandbox without the standard libraries: they are
-- reached at call time, never captured at load time.
local function floor(x)
  return math.floor(x)
end
local TWO53 = 9007199254740992

local function fmt(n)
  return string.format('%d', n)
end

-- floor(a / b) for integers a, b with a < 2^53, exact (the double quotient may round up).
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function corrupt(key, what)
  error({err = 'SLUICE_CORRUPT ' .. key .. ': ' .. what}, 0)
end

-- Raises again what a `pcall` caught: an error reply (a table) as it is, a message (what a
-- failed `redis.call` or a Lua error leaves) as an error reply whose first word stays its
-- code (`error(message)` would prefix `ERR`), so the caller classifies it as it would the
-- same failure uncaught.
local function rethrow(e)
  if type(e) == 'table' then
    error(e, 0)
  end
  error({err = tostring(e)}, 0)
end

-- Stored state as Redis itself reads an integer (INCRBY, HINCRBY: digits only, no sign, no
-- leading zero, no space), here also at most 2^53: `v` as a number, or nil when it is not
-- one. Lua's `tonumber` alone takes `0x1`, ` 5`, `1e3`, `05` and `1.0`, which a later INCRBY
-- or HINCRBY would refuse halfway through a decision's writes.
local function as_int(v)
  local n = tonumber(v)
  if n == nil or n < 0 or n % 1 ~= 0 or n > TWO53 then
    return nil
  end
  if type(v) == 'string' and v ~= '0' and not string.find(v, '^[1-9]%d*$') then
    return nil
  end
  return n
end

-- An integer field, or nil when absent; anything else is corrupt state.
local function int_field(key, name, v)
  if v == false or v == nil then
    return nil
  end
  local n = as_int(v)
  if n == nil then
    corrupt(key, 'field ' .. name .. ' holds ' .. tostring(v) .. ', not an integer')
  end
  return n
end

-- `redis.call(cmd, key, ...)` with the values of `list` as its last arguments, at most CHUNK
-- at once (Lua's `unpack` fails beyond about 8,000 values); the replies, concatenated.
local CHUNK = 1000
local function call_chunked(cmd, key, list)
  local out = {}
  for i = 1, #list, CHUNK do
    local last = i + CHUNK - 1
    if last > #list then
      last = #list
    end
    local r = redis.call(cmd, key, unpack(list, i, last))
    if type(r) == 'table' then
      for j = 1, #r do
        out[#out + 1] = r[j]
      end
    end
  end
  return out
end

-- ----- 16-bit limbs: floor((x*y + z) / d) for x, y, z < 2^53+1, d < 2^36 -----------------

local B = 65536

local function limbs(n)
  local t = {}
  for i = 1, 4 do
    local q = floor(n / B)
    t[i] = n - q * B
    n = q
  end
  return t
end

local function muladd_div(x, y, z, d)
  local p = x * y + z
  if p < 4503599627370496 then -- 2^52: exact in a double
    return idiv(p, d)
  end
  local a, b, c = limbs(x), limbs(y), limbs(z)
  local r = {0, 0, 0, 0, 0, 0, 0, 0}
  for i = 1, 4 do
    r[i] = r[i] + c[i]
    for j = 1, 4 do
      r[i + j - 1] = r[i + j - 1] + a[i] * b[j]
    end
  end
  for i = 1, 7 do -- carry: every sum above is below 2^35
    local q = floor(r[i] / B)
    r[i] = r[i] - q * B
    r[i + 1] = r[i + 1] + q
  end
  local rem, q = 0, 0
  for i = 8, 1, -1 do -- long division by d < 2^36: rem*B + limb < 2^52
    local cur = rem * B + r[i]
    local qi = idiv(cur, d)
    rem = cur - qi * d
    q = q * B + qi
  end
  return q
end

-- ----- time pairs (ms, frac/max) for the token bucket --------------------------------------

local function pair_gt(ams, af, bms, bf)
  return ams > bms or (ams == bms and af > bf)
end

local function pair_add(ams, af, bms, bf, m)
  if af >= m - bf then
    return ams + bms + 1, af - (m - bf)
  end
  return ams + bms, af + bf
end

-- a - b for a >= b
local function pair_sub(ams, af, bms, bf, m)
  if af >= bf then
    return ams - bms, af - bf
  end
  return ams - bms - 1, af + (m - bf)
end

-- ----- the algorithms ----------------------------------------------------------------------
-- One step per algorithm (`fw_step`, `sw_step`, `tb_step`; `concurrency` for leases) reads a
-- limit's stored state, checks it, and judges a cost against it, writing nothing; its `_add`
-- records an admitted cost. Every path calls them: the lean path (`rate`, single or batched,
-- and `one` for a policy of one limit) replies with the state the step read, the general path
-- (`decide`) reports each limit's remaining, reset and retry from what the step returns, and
-- refunds read through them.
-- `fw_fast` is the one other way a fixed window is counted: INCRBY first, for checks of
-- policies of fixed windows only.

-- ----- fixed windows ------------------------------------------------------------------------
-- One key per window, in one of two encodings, chosen when the window opens:
--   a counter  a string integer `used` whose absolute expiry is the window's end + margin
--              (SET PXAT): reset = PEXPIRETIME - margin. INCRBY counts into it, DECRBY
--              refunds. Redis expires it by its own clock, so it is opened only when the
--              caller's clock is within half the margin of Redis's (always under `clock:
--              redis`; one TIME per window opened tells): the key then outlives its window.
--   a hash     reset, used; PEXPIRE reset - now + margin (relative: it outlives its window
--              whatever the clocks say). Opened by a caller whose clock is further off.
-- Every path reads both (GET, and HMGET when the key holds a hash), so a window is counted in
-- one place whichever process opened it, and a script never touches another key for it.
-- Redis Cluster's MIGRATE moves a counter with a relative TTL: its end moves by the offset
-- between the two nodes' clocks (and the time in flight), once per migration; a hash's end is
-- its `reset`, which moves with nothing (docs/redis.md, "Time and expiry").

-- Now in ms: ARGV[1], or Redis TIME when it says "redis".
local function now_of(arg)
  if arg == 'redis' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

-- Whether a window opened now may live in a counter, whose absolute expiry (reset + margin)
-- Redis reads on its own clock: only when the caller's clock is within half the margin of
-- Redis's (always under `clock: redis`, with a margin above 0).
local function counter_fits(now, margin, redis_clock)
  if redis_clock then
    return margin > 0
  end
  local skew = now_of('redis') - now
  return 2 * skew < margin and -2 * skew < margin
end

-- The end of a fixed window opened at `now`: `now + per`, or the next multiple of `per` when
-- aligned.
local function window_end(now, per, aligned)
  if aligned then
    return idiv(now, per) * per + per
  end
  return now + per
end

-- Writes into `key` a window ending at `r` that holds `used`: a counter when the caller's clock
-- fits, else a hash. `held` is the encoding the key holds now ('c', 'h' or nil): SET replaces
-- a hash, a counter is deleted before a hash is written. Returns the encoding written.
local function fw_write(key, r, used, now, margin, redis_clock, held)
  if counter_fits(now, margin, redis_clock) then
    redis.call('SET', key, used, 'PXAT', r + margin)
    return 'c'
  end
  if held == 'c' then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, 'reset', r, 'used', used)
  redis.call('PEXPIRE', key, r - now + margin)
  return 'h'
end

-- The window in `key`: used, reset and its encoding ('c', 'h'); nil when there is none.
-- A counter without expiry (PERSIST, `RESTORE key 0`, a tool's SET), or whose end lies further
-- than `per` + margin ahead (a restore with a wrong TTL), has lost its window's end: it is
-- re-armed, its count kept and its end where a window opened now would end (`write`: written
-- back; a read-only call reports it so). It never admits more than `max` over the count it
-- kept, and recovers by itself.
local function fw_read(key, now, per, aligned, margin, write, redis_clock)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    -- Not a string: a hash window (any other type fails HMGET with WRONGTYPE).
    local h = redis.call('HMGET', key, 'reset', 'used')
    local reset, used = int_field(key, 'reset', h[1]), int_field(key, 'used', h[2])
    if reset == nil or used == nil then
      corrupt(key, 'a fixed window needs both reset and used')
    end
    return used, reset, 'h'
  end
  if not v then
    return nil
  end
  local used = as_int(v)
  if used == nil then
    corrupt(key, 'a fixed-window counter holds ' .. tostring(v) .. ', not an integer')
  end
  local e = redis.call('PEXPIRETIME', key)
  if e >= 0 and e - margin <= now + per + margin then
    return used, e - margin, 'c'
  end
  local r = window_end(now, per, aligned)
  if write then
    return used, r, fw_write(key, r, used, now, margin, redis_clock, 'c')
  end
  return used, r, 'c'
end

-- The fixed window step: the window in `key` as `fw_read` reads it (used, reset, encoding;
-- nil: none), whether it is open, and whether it admits `cost`.
local function fw_step(key, max, per, aligned, now, cost, margin, write, redis_clock)
  local used, reset, enc = fw_read(key, now, per, aligned, margin, write, redis_clock)
  local open = enc ~= nil and now < reset
  local admits = cost <= max and (cost == 0 or not open or used + cost <= max)
  return used, reset, enc, open, admits
end

-- Records `cost` in the window `fw_step` read (`enc`, `open`): added where it is when open,
-- else a new window ending where one opened now ends.
local function fw_add(key, enc, open, per, aligned, cost, now, margin, redis_clock)
  if not open then
    fw_write(key, window_end(now, per, aligned), cost, now, margin, redis_clock, enc)
  elseif enc == 'c' then
    redis.call('INCRBY', key, cost)
  else
    redis.call('HINCRBY', key, 'used', cost)
  end
end

-- Whether a counter's end `reset`, read at `now`, belongs to a window that is open and whose
-- end is where a window of `per` can end (not a counter to re-arm: `fw_read`).
local function counter_open(reset, now, per, margin)
  return now < reset and reset <= now + per + margin
end

-- Takes back the optimistic INCRBYs of the first `m` counters from KEYS[k] (`made[i]`: the
-- INCRBY created the counter, which is then deleted; `made` is nil when none was).
local function fw_undo(keys, k, m, cost, made)
  for i = 0, m - 1 do
    if made and made[i] then
      redis.call('DEL', keys[k + i])
    else
      redis.call('DECRBY', keys[k + i], cost)
    end
  end
end

-- The fast path of a check of a cost above zero on a policy of n >= 1 limits, every one a
-- fixed window (numbers from v[a], 3 per limit): INCRBY first, then the counter's expiry
-- tells whether its window is open (2 commands per limit); if any refuses, every count is
-- taken back with DECRBY. A counter INCRBY just made, or whose window has closed, opens a new
-- window (its expiry set as `rate` would set it, SET PXAT, once all admit) when the caller's
-- clock fits. Anything else (a cost above a max, a hash window, a counter to re-arm, a
-- caller's clock too far off Redis's) is undone and left to `rate`: returns nil. Nothing else
-- is written before a failure is raised, so a failed decision wrote nothing. The reply is
-- `rate`'s: the state as read.
local function fw_fast(keys, k, n, v, a, now, cost, margin, redis_clock)
  -- The reply, sized for one limit (a table that grows is rebuilt as it grows).
  local out, made, fresh, fits = {1, now, 0, 0}, nil, nil, nil
  for i = 0, n - 1 do
    local key, o = keys[k + i], a + 3 * i
    local max, per = v[o + 1], v[o + 2]
    if cost > max then
      fw_undo(keys, k, i, cost, made)
      return nil
    end
    local u = redis.pcall('INCRBY', key, cost)
    if type(u) ~= 'number' then
      fw_undo(keys, k, i, cost, made)
      if string.sub(tostring(u.err), 1, 9) == 'WRONGTYPE' then
        return nil -- a hash window (or corrupt state `rate` names): nothing was written
      end
      corrupt(key, 'a fixed-window counter is not an integer (' .. tostring(u.err) .. ')')
    end
    local used = u - cost
    if used < 0 then
      fw_undo(keys, k, i + 1, cost, made)
      corrupt(key, 'a fixed-window counter holds ' .. used)
    end
    local e = redis.call('PEXPIRETIME', key)
    local reset = e - margin
    if e >= 0 and counter_open(reset, now, per, margin) then
      out[3 + 2 * i], out[4 + 2 * i] = reset, used
      if u > max then
        out[1] = 0
      end
    else
      local new = used == 0 and e == -1
      if new then
        made = made or {}
        made[i] = true
      end
      if not (new or (e >= 0 and reset <= now)) then
        fw_undo(keys, k, i + 1, cost, made)
        return nil
      end
      if fits == nil then
        fits = counter_fits(now, margin, redis_clock)
      end
      if not fits then
        fw_undo(keys, k, i + 1, cost, made)
        return nil
      end
      fresh = fresh or {}
      fresh[i] = window_end(now, per, v[o] == 2)
      if new then
        out[3 + 2 * i], out[4 + 2 * i] = 0, 0
      else
        out[3 + 2 * i], out[4 + 2 * i] = reset, used
      end
    end
  end
  if out[1] == 0 then
    fw_undo(keys, k, n, cost, made)
  elseif fresh then
    for i, r in pairs(fresh) do
      redis.call('SET', keys[k + i], cost, 'PXAT', r + margin)
    end
  end
  return out
end

-- ----- sliding windows ----------------------------------------------------------------------

-- The sliding window step: reads the buckets in `key` (<bucket start> -> units) and writes
-- into `out` after `out[at]` the count k and the k counted buckets (start, units; any order).
-- Returns whether it admits `cost`, the units counted, the current bucket's start, the oldest
-- counted start (nil: none), the newest (at least the current one), the stale fields (nil:
-- none) and the index of the last value it wrote.
local function sw_step(key, max, per, p, now, cost, out, at)
  local h = redis.call('HGETALL', key)
  local current = now - now % p
  local lowest = current + p - per
  local used, first, newest, count, stale = 0, nil, current, at + 1, nil
  at = count
  for j = 1, #h, 2 do
    local start, c = as_int(h[j]), as_int(h[j + 1])
    if start == nil or c == nil then -- corrupt: named (only then, off the hot path) and raised
      int_field(key, 'bucket', h[j])
      int_field(key, 'bucket ' .. h[j], h[j + 1])
    end
    if start >= lowest then
      used = used + c
      if start > newest then
        newest = start
      end
      if first == nil or start < first then
        first = start
      end
      out[at + 1], out[at + 2] = start, c
      at = at + 2
    else
      stale = stale or {}
      stale[#stale + 1] = h[j]
    end
  end
  out[count] = (at - count) / 2
  return cost <= max and (cost == 0 or used + cost <= max), used, current, first, newest, stale,
    at
end

-- Records `cost` in the current bucket: PEXPIRE only when that bucket is new (an existing one
-- was given its expiry when it was made); HDEL of the stale buckets.
local function sw_add(key, current, newest, per, cost, now, margin, stale)
  if redis.call('HINCRBY', key, current, cost) == cost then
    redis.call('PEXPIRE', key, newest + per - now + margin)
  end
  if stale then
    call_chunked('HDEL', key, stale)
  end
end

-- The counted buckets `sw_step` appended to `flat` (from flat[2]) as {start, units}, oldest
-- first.
local function sw_sorted(flat)
  local t = {}
  for j = 2, #flat, 2 do
    t[#t + 1] = {flat[j], flat[j + 1]}
  end
  table.sort(t, function(x, y) return x[1] < y[1] end)
  return t
end

-- ----- token buckets ------------------------------------------------------------------------

-- The token bucket step (GCRA): reads the bucket in `key` and judges `cost`, whose step is
-- (sms, sf) (a cost of 0, a report, steps by nothing). Returns whether it admits, the state as
-- read (tat, frac; 0, 0: none), how far its TAT lies beyond now (ams, af), and the TAT after
-- the cost, from now (nms, nf; nil when the cost is above max or burst: no wait admits it).
local function tb_step(key, max, burst, tms, tf, sms, sf, now, cost)
  local v = redis.call('HMGET', key, 'tat', 'frac')
  local tat, frac = int_field(key, 'tat', v[1]), int_field(key, 'frac', v[2])
  if (tat == nil) ~= (frac == nil) then
    corrupt(key, 'a token bucket needs both tat and frac')
  end
  local ams, af = 0, 0
  if tat == nil then
    tat, frac = 0, 0
  elseif frac >= max then
    corrupt(key, 'frac ' .. fmt(frac) .. ' is not below max')
  elseif tat > now or (tat == now and frac > 0) then
    ams, af = tat - now, frac
  end
  if cost > max or cost > burst then
    return false, tat, frac, ams, af, nil, nil
  end
  if cost == 0 then
    sms, sf = 0, 0
  end
  local nms, nf = pair_add(ams, af, sms, sf, max)
  return not pair_gt(nms, nf, tms, tf), tat, frac, ams, af, nms, nf
end

-- Records an admitted cost: the new TAT, now + (nms, nf), expiring with it + margin.
local function tb_add(key, nms, nf, now, margin)
  local ttl = nms + margin
  if nf > 0 then
    ttl = ttl + 1
  end
  redis.call('HSET', key, 'tat', now + nms, 'frac', nf)
  redis.call('PEXPIRE', key, ttl)
end

-- The bucket step of `g` units from the step of one (sms, sf): g times (ms, frac), by doubling,
-- so every intermediate stays exact (each partial step is at most the step of g <= burst).
local function scale_step(sms, sf, max, g)
  local rms, rf = 0, 0
  while g > 0 do
    local half = floor(g / 2)
    if g - half * 2 == 1 then
      rms, rf = pair_add(rms, rf, sms, sf, max)
    end
    g = half
    if g > 0 then
      sms, sf = pair_add(sms, sf, sms, sf, max)
    end
  end
  return rms, rf
end

-- ----- the general path: each limit's report ------------------------------------------------
-- Each returns: admits, remaining, reset, retry (-1 = never), write (a function or nil).

local function outcome_refused(remaining, reset, retry)
  return false, remaining, reset, retry, nil
end

local function fixed_window(key, l, cost, now, margin)
  local max, per, aligned = l.max, l.per, l.aligned
  local used, reset, enc, open, admits =
    fw_step(key, max, per, aligned, now, cost, margin, l.write, l.redis_clock)
  local remaining = max
  if open then
    remaining = math.max(max - used, 0)
  end
  local r = now
  if open then
    r = reset
  elseif aligned then
    r = window_end(now, per, true)
  end
  if cost > max then
    return outcome_refused(remaining, r, -1)
  end
  if not admits then
    return outcome_refused(remaining, r, r - now)
  end
  if cost == 0 then
    return true, remaining, r, 0, nil
  end
  if not open then
    r = window_end(now, per, aligned)
  end
  return true, remaining - cost, r, 0, function()
    fw_add(key, enc, open, per, aligned, cost, now, margin, l.redis_clock)
  end
end

local function sliding_window(key, l, cost, now, margin)
  local max, per, flat = l.max, l.per, {}
  local admits, used, current, first, newest, stale =
    sw_step(key, max, per, l.precision, now, cost, flat, 0)
  local remaining = math.max(max - used, 0)
  local r = now
  if first then
    r = first + per
  end
  if cost > max then
    return outcome_refused(remaining, r, -1)
  end
  if not admits then
    local counted, left = sw_sorted(flat), used
    for i = 1, #counted do
      left = left - counted[i][2]
      if cost <= max - left then
        return outcome_refused(remaining, r, counted[i][1] + per - now)
      end
    end
    return outcome_refused(remaining, r, -1) -- unreachable: cost <= max
  end
  if cost == 0 then
    return true, remaining, r, 0, nil
  end
  local oldest = current
  if first and first < current then
    oldest = first
  end
  return true, remaining - cost, oldest + per, 0, function()
    sw_add(key, current, newest, per, cost, now, margin, stale)
  end
end

local function bucket_remaining(l, ams, af)
  if pair_gt(ams, af, l.tau_ms, l.tau_frac) then
    return 0
  end
  local dms, df = pair_sub(l.tau_ms, l.tau_frac, ams, af, l.max)
  return muladd_div(dms, l.max, df, l.per)
end

local function ceil_ms(ms, f)
  if f > 0 then
    return ms + 1
  end
  return ms
end


local function token_bucket(key, l, cost, now, margin)
  local admits, _, _, ams, af, nms, nf =
    tb_step(key, l.max, l.burst, l.tau_ms, l.tau_frac, l.step_ms, l.step_frac, now, cost)
  local remaining = bucket_remaining(l, ams, af)
  local reset = now + ceil_ms(ams, af)
  if nms == nil then
    return outcome_refused(remaining, reset, -1)
  end
  if not admits then
    local wms, wf = pair_sub(nms, nf, l.tau_ms, l.tau_frac, l.max)
    return outcome_refused(remaining, reset, ceil_ms(wms, wf))
  end
  if cost == 0 then
    return true, remaining, reset, 0, nil
  end
  return true, bucket_remaining(l, nms, nf), now + ceil_ms(nms, nf), 0, function()
    tb_add(key, nms, nf, now, margin)
  end
end

-- A concurrency limit's leases: a sorted set (its key: member lease id, score expiry) and the
-- units hash `l.units` (lease id -> cost, and `used`, the total cost of every lease in the
-- set, lapsed or not). Returns the units of the live leases, leaving out `except` (a lease
-- being taken again), the leases that lapsed ({id, cost}: deleted by the next write), the
-- excepted lease's cost when it is live, and the stored total.
local function cc_read(key, l, now, except)
  local total = int_field(l.units, 'used', redis.call('HGET', l.units, 'used')) or 0
  local used, gone = total, {}
  local lapsed = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now))
  if #lapsed > 0 then
    local costs = call_chunked('HMGET', l.units, lapsed)
    for i = 1, #lapsed do
      local c = int_field(l.units, 'lease ' .. lapsed[i], costs[i])
      if c == nil then
        corrupt(l.units, 'lease ' .. lapsed[i] .. ' has no cost')
      end
      used = used - c
      gone[#gone + 1] = {lapsed[i], c}
    end
  end
  local own = nil
  if except ~= nil then
    local e = redis.call('ZSCORE', key, except)
    if e and tonumber(e) > now then
      own = int_field(l.units, 'lease ' .. except, redis.call('HGET', l.units, except))
      if own == nil then
        corrupt(l.units, 'lease ' .. except .. ' has no cost')
      end
      used = used - own
    end
  end
  if used < 0 then
    corrupt(l.units, 'used ' .. fmt(total) .. ' is less than the leases it counts')
  end
  return used, gone, own, total
end

-- When the last live lease other than `except` lapses (`now` when none is held).
local function cc_reset(key, now, except)
  local top = redis.call('ZREVRANGE', key, 0, 1, 'WITHSCORES')
  for j = 1, #top, 2 do
    if top[j] ~= except then
      local e = tonumber(top[j + 1])
      if e > now then
        return e
      end
      return now
    end
  end
  return now
end

-- Deletes the lapsed leases `gone` (and `also`, a lease id, when given).
local function cc_drop(key, l, gone, also)
  local ids = {}
  for i = 1, #gone do
    ids[#ids + 1] = gone[i][1]
  end
  if also ~= nil then
    ids[#ids + 1] = also
  end
  if #ids > 0 then
    call_chunked('ZREM', key, ids)
    call_chunked('HDEL', l.units, ids)
  end
end

-- `l.lease` is set for `hold` only: an admitted cost above zero is then held under that id,
-- replacing a lease of the same id (whose own units do not count against it).
local function concurrency(key, l, cost, now, margin)
  local lease = nil
  if cost > 0 then
    lease = l.lease
  end
  local used, gone = cc_read(key, l, now, lease)
  local reset = cc_reset(key, now, lease)
  local max = l.max
  local remaining = max - used
  if remaining < 0 then
    remaining = 0
  end
  if cost > max then
    return outcome_refused(remaining, reset, -1)
  end
  if cost > remaining then
    -- Leases lapse in order of expiry: the first instant at which what is left admits.
    local left, offset = used, 0
    while true do
      local batch = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now), '+inf', 'WITHSCORES',
        'LIMIT', offset, 16)
      if #batch == 0 then
        return outcome_refused(remaining, reset, -1) -- unreachable: cost <= max
      end
      offset = offset + 16
      for j = 1, #batch, 2 do
        if batch[j] ~= lease then
          local c = int_field(l.units, 'lease ' .. batch[j], redis.call('HGET', l.units, batch[j]))
          if c == nil then
            corrupt(l.units, 'lease ' .. batch[j] .. ' has no cost')
          end
          left = left - c
          if left + cost <= max then
            return outcome_refused(remaining, reset, tonumber(batch[j + 1]) - now)
          end
        end
      end
    end
  end
  if lease == nil then
    return true, remaining, reset, 0, nil
  end
  local expires = now + l.per
  local new_reset = reset
  if expires > new_reset then
    new_reset = expires
  end
  return true, remaining - cost, new_reset, 0, function()
    cc_drop(key, l, gone, nil)
    redis.call('ZADD', key, fmt(expires), lease)
    redis.call('HSET', l.units, lease, fmt(cost), 'used', fmt(used + cost))
    local ttl = fmt(new_reset - now + margin)
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', l.units, ttl)
  end
end

local STEP = {fixed_window, fixed_window, sliding_window, token_bucket, concurrency}

-- ----- refunds -----------------------------------------------------------------------------

local function refund_fixed(key, l, cost, now, margin)
  local used, reset, enc = fw_read(key, now, l.per, l.aligned, margin, true, l.redis_clock)
  if enc and now < reset and used > 0 then
    local back = cost
    if back > used then
      back = used
    end
    if enc == 'c' then
      redis.call('DECRBY', key, back)
    else
      redis.call('HINCRBY', key, 'used', -back)
    end
  end
end

local function refund_sliding(key, l, cost, now, margin)
  local flat = {}
  local _, _, _, _, _, stale = sw_step(key, l.max, l.per, l.precision, now, 0, flat, 0)
  local counted = sw_sorted(flat)
  if #counted == 0 then
    return
  end
  stale = stale or {}
  local left = cost
  for i = #counted, 1, -1 do
    if left == 0 then
      break
    end
    local b = counted[i]
    local take = b[2]
    if left < take then
      take = left
    end
    left = left - take
    if b[2] - take == 0 then
      stale[#stale + 1] = fmt(b[1])
    else
      redis.call('HSET', key, fmt(b[1]), fmt(b[2] - take))
    end
  end
  if #stale > 0 then
    call_chunked('HDEL', key, stale)
  end
end

local function refund_bucket(key, l, cost, now, margin)
  local _, _, _, ams, af = tb_step(key, l.max, l.burst, l.tau_ms, l.tau_frac, 0, 0, now, 0)
  if ams == 0 and af == 0 then
    return
  end
  local rms, rf = 0, 0
  if pair_gt(ams, af, l.step_ms, l.step_frac) then
    rms, rf = pair_sub(ams, af, l.step_ms, l.step_frac, l.max)
  end
  redis.call('HSET', key, 'tat', fmt(now + rms), 'frac', fmt(rf))
end

-- A refund is not a release: it leaves leases as they are.
local function refund_none()
end

local REFUND = {refund_fixed, refund_fixed, refund_sliding, refund_bucket, refund_none}

-- ----- the policy --------------------------------------------------------------------------

-- The arguments each operation adds after the limits', and the keys after the limits' own.
local EXTRA_ARGS = {check = 0, peek = 0, refund = 0, acquire = 3, hold = 1, release = 1}
local EXTRA_KEYS = {check = 0, peek = 0, refund = 0, acquire = 1, hold = 0, release = 0}

local function parse(op, keys, args)
  local now = now_of(args[1])
  local cost, margin, n = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  if now == nil or cost == nil or margin == nil or n == nil or n < 1
    or #args ~= 4 + 9 * n + EXTRA_ARGS[op] then
    error('SLUICE_ARGS expected now, cost, margin, n and 9 values per limit for ' .. #keys .. ' keys', 0)
  end
  local limits = {}
  for i = 1, n do
    local o = 4 + 9 * (i - 1)
    local alg = tonumber(args[o + 1])
    limits[i] = {
      alg = alg, aligned = alg == 2,
      max = tonumber(args[o + 2]), per = tonumber(args[o + 3]),
      precision = tonumber(args[o + 4]), burst = tonumber(args[o + 5]),
      tau_ms = tonumber(args[o + 6]), tau_frac = tonumber(args[o + 7]),
      step_ms = tonumber(args[o + 8]), step_frac = tonumber(args[o + 9]),
      write = op ~= 'peek', redis_clock = args[1] == 'redis',
    }
    if STEP[alg] == nil then
      error('SLUICE_ARGS unknown algorithm ' .. tostring(args[o + 1]), 0)
    end
  end
  -- A concurrency limit's units hash is the last key.
  local units = 0
  for i = 1, n do
    if limits[i].alg == 5 then
      units = 1
      limits[i].units = keys[#keys]
    end
  end
  if #keys ~= n + EXTRA_KEYS[op] + units then
    error('SLUICE_ARGS expected ' .. (n + EXTRA_KEYS[op] + units) .. ' keys for ' .. n ..
      ' limits, got ' .. #keys, 0)
  end
  return now, cost, margin, limits
end

-- Decides `cost` over every limit; with `record`, writes only if every limit admits.
local function decide(keys, now, cost, margin, limits, record)
  local n = #limits
  local admits, remaining, reset, retry, writes = {}, {}, {}, {}, {}
  local allowed = true
  for i = 1, n do
    -- `skip`: a limit not charged (the other limits of a renewed lease).
    local c = cost
    if limits[i].skip then
      c = 0
    end
    admits[i], remaining[i], reset[i], retry[i], writes[i] =
      STEP[limits[i].alg](keys[i], limits[i], c, now, margin)
    allowed = allowed and admits[i]
  end
  if not allowed and cost > 0 then
    -- Nothing is recorded: limits that would admit report their state without the cost.
    for i = 1, n do
      if admits[i] then
        admits[i], remaining[i], reset[i], retry[i] =
          STEP[limits[i].alg](keys[i], limits[i], 0, now, margin)
      end
    end
  end
  if allowed and record then
    for i = 1, n do
      if writes[i] then
        writes[i]()
      end
    end
  end
  local reply = {allowed and 1 or 0, now}
  for i = 1, n do
    reply[#reply + 1] = admits[i] and 1 or 0
    reply[#reply + 1] = remaining[i]
    reply[#reply + 1] = reset[i]
    reply[#reply + 1] = retry[i]
  end
  return reply
end

-- Takes the most every limit admits now, between `cost` and the batch in the last ARGV
-- (evaluate.rs `acquire`): each limit's remaining at cost 0 is exactly the most it admits.
local function acquire(keys, args, now, cost, margin, limits)
  local grant = tonumber(args[5 + 9 * #limits])
  if grant == nil then
    error('SLUICE_ARGS acquire needs the most units to take', 0)
  end
  for i = 1, #limits do
    local l = limits[i]
    local _, remaining = STEP[l.alg](keys[i], l, 0, now, margin)
    if remaining < grant then
      grant = remaining
    end
    if l.max < grant then
      grant = l.max
    end
  end
  local take = cost
  if grant >= cost and grant > 0 then
    take = grant
  end
  for i = 1, #limits do
    if limits[i].alg == 4 then
      local l = limits[i]
      l.step_ms, l.step_frac = scale_step(l.step_ms, l.step_frac, l.max, take)
    end
  end
  local reply = decide(keys, now, take, margin, limits, true)
  reply[#reply + 1] = take
  -- The holders: this one counts until now + ttl; those past their time are dropped.
  local holder, ttl, hk = args[6 + 9 * #limits], tonumber(args[7 + 9 * #limits]), keys[#limits + 1]
  local holders = 0
  if holder ~= '0' then
    if ttl == nil or ttl < 1 then
      error('SLUICE_ARGS acquire needs how long a holder counts', 0)
    end
    redis.call('ZADD', hk, fmt(now + ttl), holder)
    redis.call('ZREMRANGEBYSCORE', hk, '-inf', fmt(now))
    redis.call('PEXPIRE', hk, fmt(ttl + margin))
    holders = redis.call('ZCARD', hk)
  end
  reply[#reply + 1] = holders
  return reply
end
-- ----- rate policies: the lean path -----------------------------------------------------------
-- A check or peek of a policy whose limits are fixed windows, sliding windows and token buckets
-- (any mix): the calls that make up nearly all the traffic. The Rust caller has validated
-- every argument (the policy is valid by construction), so nothing here re-checks them; only
-- the stored state is checked, before anything is written. The script decides and writes; it
-- returns each limit's state as it was read, and the caller computes every reported number
-- (remaining, reset, retry_after, the binding limit) with `sluice_core::evaluate` itself, the
-- very function the memory store runs. The same steps as the general path, without its
-- closures and reports: no table per limit for a policy of one limit, numbers passed to Redis
-- as they are.
--
-- Lean layout (functions __LIB___rate and __LIB___rate_ro):
--   KEYS[i]  limit i's state, in the policy's order (a fixed window's: see "fixed windows")
--   ARGV[1]  now in ms, or "redis"; ARGV[2] cost; ARGV[3] expiry margin in ms;
--   then per limit, by algorithm:
--     1 max per          fixed window (2: aligned): a window opens as a counter, or as a hash
--                        when the caller's clock is off Redis's by half the margin or more
--                        (`counter_fits`)
--     3 max per prec     sliding window
--     4 max per burst tau_ms tau_frac step_ms step_frac
--                        token bucket; the step is `cost·per/max` (in a batch: of one unit)
-- Reply: { allowed (0/1), now, then per limit the state read }:
--   fixed window    reset, used          (0, 0: none)
--   sliding window  k, then k pairs      (the counted buckets, start and units, any order)
--   token bucket    tat, frac            (0, 0: none)
-- Writes, when every limit admits a cost above zero and the call records (a check):
--   fixed window    inside an open window only `used` (INCRBY of the counter, HINCRBY of
--                   the hash): the expiry set when it opened still covers it; a new window:
--                   SET counter cost PXAT end + margin, or HSET reset and used + PEXPIRE
--                   end - now + margin. A check of a policy of fixed windows only takes
--                   `fw_fast` first: INCRBY, then PEXPIRETIME (DECRBY when refused; undone
--                   and left to `rate` when the key holds a hash or a counter to re-arm).
--   sliding window  HINCRBY of the current bucket; PEXPIRE only when that bucket is new (an
--                   existing one was given its expiry when it was made); HDEL of stale buckets
--   token bucket    HSET tat and frac, PEXPIRE the new TAT + margin
-- The general path writes the same (the same `_add` functions).

-- The number of values per limit on the lean layout, by algorithm.
local WIDTH = {3, 3, 4, 8}

-- Records `cost` in limit `alg` of `key` as its step left it (x, y, z: what `rate` kept of
-- the step's answer for the write).
local function add(alg, key, per, x, y, z, cost, now, margin, redis_clock)
  if alg == 1 or alg == 2 then
    fw_add(key, x, y, per, alg == 2, cost, now, margin, redis_clock)
  elseif alg == 3 then
    sw_add(key, x, y, per, cost, now, margin, z)
  else
    tb_add(key, x, y, now, margin)
  end
end

-- Decides `cost` for the policy whose keys start at KEYS[k] and whose limits' values (as
-- numbers) start at v[a]; `n` limits. With `unit`, a bucket's step in `v` is that of one
-- unit and is scaled to the cost here. Every limit is read and judged before anything is
-- written; a policy of one limit writes at once, without a table but the reply.
local function rate(keys, k, v, a, n, now, cost, margin, record, unit, redis_clock)
  -- The reply, sized for one fixed window or bucket (a table that grows is rebuilt as it
  -- grows); `at`: the index of its last value.
  local out, at = {1, now, 0, 0}, 2
  local write = record and cost > 0
  local pending = nil -- what each limit would write, for a policy of several
  local o = a
  for i = 0, n - 1 do
    local key, alg, max, per = keys[k + i], v[o], v[o + 1], v[o + 2]
    local admits, x, y, z, _
    if alg == 1 or alg == 2 then
      local used, reset
      used, reset, x, y, admits = fw_step(key, max, per, alg == 2, now, cost, margin, record,
        redis_clock)
      if x then
        out[at + 1], out[at + 2] = reset, used
      else
        out[at + 1], out[at + 2] = 0, 0
      end
      at = at + 2
    elseif alg == 3 then
      admits, _, x, _, y, z, at = sw_step(key, max, per, v[o + 3], now, cost, out, at)
    else
      local burst, sms, sf = v[o + 3], v[o + 6], v[o + 7]
      if unit and cost > 1 and cost <= max and cost <= burst then
        sms, sf = scale_step(sms, sf, max, cost)
      end
      local tat, frac
      admits, tat, frac, _, _, x, y = tb_step(key, max, burst, v[o + 4], v[o + 5], sms, sf, now,
        cost)
      out[at + 1], out[at + 2] = tat, frac
      at = at + 2
    end
    o = o + WIDTH[alg]
    if not admits then
      out[1], write = 0, false
    elseif write and n == 1 then
      add(alg, key, per, x, y, z, cost, now, margin, redis_clock)
    elseif write then
      pending = pending or {}
      pending[i + 1] = {alg, per, x, y, z}
    end
  end
  if write and n > 1 then
    for i = 0, n - 1 do
      local w = pending[i + 1]
      add(w[1], keys[k + i], w[2], w[3], w[4], w[5], cost, now, margin, redis_clock)
    end
  end
  out[at + 1] = nil -- a lone sliding window without buckets leaves one slot unused
  return out
end

-- A check of a policy of one sliding window or token bucket (values from v[a]): the limit's
-- step, then its `_add` when it admits, as `rate` runs them for one limit, without its loop
-- over limits (a tenth of a token bucket's Lua time in a batch).
local function one(key, v, a, now, cost, margin, unit)
  local alg, max, per = v[a], v[a + 1], v[a + 2]
  if alg == 3 then
    local out = {1, now}
    local admits, _, current, _, newest, stale =
      sw_step(key, max, per, v[a + 3], now, cost, out, 2)
    if admits then
      sw_add(key, current, newest, per, cost, now, margin, stale)
    else
      out[1] = 0
    end
    return out
  end
  local burst, sms, sf = v[a + 3], v[a + 6], v[a + 7]
  if unit and cost > 1 and cost <= max and cost <= burst then
    sms, sf = scale_step(sms, sf, max, cost)
  end
  local admits, tat, frac, _, _, nms, nf =
    tb_step(key, max, burst, v[a + 4], v[a + 5], sms, sf, now, cost)
  if not admits then
    return {0, now, tat, frac}
  end
  tb_add(key, nms, nf, now, margin)
  return {1, now, tat, frac}
end

-- Whether the `n` limits whose values start at v[a] are all fixed windows.
local function all_fixed(v, a, n)
  for i = 0, n - 1 do
    local alg = v[a + 3 * i]
    if alg ~= 1 and alg ~= 2 then
      return false
    end
  end
  return true
end

-- `args[from..to]` as numbers, into `v` at `from - shift..to - shift` (from index 1, a table's
-- array part: read faster than its hash part).
local function numbers(args, from, to, v, shift)
  for i = from, to do
    v[i - shift] = tonumber(args[i])
  end
  return v
end

-- A single call on the lean layout.
local function rate_call(keys, args, record)
  local now, cost, margin = now_of(args[1]), tonumber(args[2]), tonumber(args[3])
  local v, n, redis_clock = numbers(args, 4, #args, {}, 3), #keys, args[1] == 'redis'
  if record and cost > 0 and all_fixed(v, 1, n) then
    local r = fw_fast(keys, 1, n, v, 1, now, cost, margin, redis_clock)
    if r then
      return r
    end
  elseif record and cost > 0 and n == 1 then
    return one(keys[1], v, 1, now, cost, margin, false)
  end
  return rate(keys, 1, v, 1, n, now, cost, margin, record, false, redis_clock)
end

-- ----- a batch: the concurrent decisions of one Redis (one slot) in one call ---------------------
-- Function __LIB___batch. Each decision is a check (1) or a peek (2) of a rate policy, decided
-- in turn exactly as a single call would, atomically and all or nothing over its policy's
-- limits; a policy's values are sent once per batch. A decision that fails (corrupt state, a
-- key of the wrong type) fails alone: it wrote nothing (every limit is read and checked before
-- any write), and its entry in the reply is that error.
--   KEYS     every decision's keys, in order (n per decision, n its policy's limits)
--   ARGV[1]  expiry margin in ms; ARGV[2] "app", or "redis" to read TIME once for the batch;
--   ARGV[3]  the number of policies P, then each policy: n, then its limits' values as in the
--            lean layout (a bucket's step is that of one unit);
--   then per decision: op (1 check, 2 peek), its policy (1..P), now (ms; unused under
--   "redis"), cost.
-- Reply: one entry per decision, the lean reply or an error.
local function batch(keys, args)
  local margin, redis_time = tonumber(args[1]), args[2] == 'redis'
  -- Each policy: where its values start in `v` (as numbers, read once), its n, and whether
  -- its limits are all fixed windows (`fw_fast`).
  local policies, v, a = {}, {}, 4
  for p = 1, tonumber(args[3]) do
    local n = tonumber(args[a])
    local o = a + 1
    for _ = 1, n do
      local width = WIDTH[tonumber(args[o])]
      numbers(args, o, o + width - 1, v, 4)
      o = o + width
    end
    policies[p] = {a - 3, n, all_fixed(v, a - 3, n)}
    a = o
  end
  local now = nil
  if redis_time then
    now = now_of('redis')
  end
  local out, k = {}, 1
  for e = a, #args, 4 do
    local p = policies[tonumber(args[e + 1])]
    local at = now or tonumber(args[e + 2])
    local cost, record = tonumber(args[e + 3]), args[e] == '1'
    local ok, r = true, nil
    if p[3] and record and cost > 0 then
      ok, r = pcall(fw_fast, keys, k, p[2], v, p[1], at, cost, margin, redis_time)
    elseif p[2] == 1 and record and cost > 0 then
      ok, r = pcall(one, keys[k], v, p[1], at, cost, margin, true)
    end
    if ok and not r then
      ok, r = pcall(rate, keys, k, v, p[1], p[2], at, cost, margin, record, true, redis_time)
    end
    if ok then
      out[#out + 1] = r
    else
      if type(r) == 'table' then
        r = r.err
      end
      out[#out + 1] = {err = tostring(r)}
    end
    k = k + p[2]
  end
  return out
end

-- Frees the lease in the last ARGV (evaluate.rs `release`) and reports the state after it;
-- the reply ends with the units it held (0: not held).
local function release(keys, args, now, margin, limits)
  local lease = args[5 + 9 * #limits]
  local freed = 0
  for i = 1, #limits do
    local l = limits[i]
    if l.alg == 5 then
      local used, gone, own = cc_read(keys[i], l, now, lease)
      if own ~= nil then
        freed = own
        cc_drop(keys[i], l, gone, lease)
        if redis.call('ZCARD', keys[i]) == 0 then
          redis.call('DEL', l.units)
        else
          redis.call('HSET', l.units, 'used', fmt(used))
        end
      end
    end
  end
  local reply = decide(keys, now, 0, margin, limits, false)
  reply[#reply + 1] = freed
  return reply
end

local function run(op, keys, args)
  if op == 'rate' or op == 'rate_ro' then
    return rate_call(keys, args, op == 'rate')
  elseif op == 'batch' then
    return batch(keys, args)
  end
  local now, cost, margin, limits = parse(op, keys, args)
  if op == 'check' then
    return decide(keys, now, cost, margin, limits, true)
  elseif op == 'peek' then
    return decide(keys, now, cost, margin, limits, false)
  elseif op == 'acquire' then
    return acquire(keys, args, now, cost, margin, limits)
  elseif op == 'hold' or op == 'release' then
    local lease = args[5 + 9 * #limits]
    if lease == nil or not string.match(lease, '^%d+$') then
      error('SLUICE_ARGS ' .. op .. ' needs a lease id', 0)
    end
    if op == 'release' then
      return release(keys, args, now, margin, limits)
    end
    -- Taking again a lease still held renews it: the other limits counted its request when
    -- it was taken, so they are neither charged nor consulted now.
    local renewing = false
    for i = 1, #limits do
      limits[i].lease = lease
      if limits[i].alg == 5 and cost > 0 then
        local e = redis.call('ZSCORE', keys[i], lease)
        renewing = e ~= false and e ~= nil and tonumber(e) > now
      end
    end
    if renewing then
      for i = 1, #limits do
        limits[i].skip = limits[i].alg ~= 5
      end
    end
    return decide(keys, now, cost, margin, limits, true)
  end
  for i = 1, #limits do
    if cost > 0 then
      REFUND[limits[i].alg](keys[i], limits[i], cost, now, margin)
    end
  end
  local reply = decide(keys, now, 0, margin, limits, false)
  reply[1] = 1
  return reply
end

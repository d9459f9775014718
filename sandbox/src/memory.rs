//! The QuickJS heap allocator: Rust's global allocator with a byte limit, a record of
//! refusals, and the work meter that the step budget reads.
//!
//! **Work.** The step budget ([`Limits::max_steps`](crate::Limits::max_steps)) counts calls of
//! the interrupt handler, one per about 10 000 bytecode jumps and calls. A built-in that does a
//! lot of work in one call (`'x'.repeat(1e6)`, `a.join()`, `JSON.stringify` of a large value)
//! costs one tick, so a loop of them could spend seconds of CPU per step. Most such work
//! allocates in proportion to what it does, so every byte allocated is charged too:
//! [`BYTES_PER_STEP`] bytes count as one step. Once the budget is spent the allocator refuses
//! every request, so even a loop that catches the resulting errors fails fast until the next
//! interrupt check stops it for good.
//!
//! QuickJS's own limit (`JS_SetMemoryLimit`) refuses allocations silently inside
//! `js_malloc_rt`, and when memory is so exhausted that it cannot build the `InternalError`,
//! it throws `null` instead. Enforcing the limit here, with QuickJS's limit left unset, lets the
//! sandbox tell that `null` apart from a script's own `throw null`.

use std::{cell::Cell, ptr, rc::Rc};

use rquickjs::allocator::{Allocator, RustAllocator};

/// Bytes allocated that count as one step of the work budget.
///
/// Building a string piece by piece costs up to about 30 ms per MiB (`'x'.repeat(1e6)`,
/// measured natively on a loaded machine), so 64 KiB is about 2 ms: no dearer than the
/// costliest ordinary steps (see docs/decisions/0006-sandbox-instance-per-call-and-work-budget.md).
pub(crate) const BYTES_PER_STEP: u64 = 64 * 1024;

/// Element visits of a scanning built-in that count as one step of the work budget.
///
/// Some built-ins loop over a string or an array without polling the interrupt handler and
/// without allocating (`String.prototype.indexOf`, `Array.prototype.reverse`, typed arrays'
/// `fill`, ...): one call is one tick however long it runs. The base prelude charges them
/// before they run (see `js/base.js`), by the elements they may visit: for a string search,
/// the naive search's worst case, length × needle length. Measured natively (release, loaded
/// machine): a linear 1 MiB search about 2.8 ms per step, reversing an array 1.3 ms per step,
/// no dearer than ordinary steps (docs/decisions/0006-sandbox-instance-per-call-and-work-budget.md).
pub(crate) const VISITS_PER_STEP: u64 = 256 * 1024;

/// Heap accounting shared between the allocator (owned by the runtime) and the engine.
#[derive(Debug)]
pub(crate) struct MemoryState {
    used: Cell<usize>,
    limit: Cell<usize>,
    refused: Cell<bool>,
    /// Interrupt-handler calls so far.
    steps: Cell<u64>,
    /// Bytes requested so far (allocations and growth), never decreasing.
    churn: Cell<u64>,
    /// Element visits charged by the base prelude for scanning built-ins, never decreasing.
    visits: Cell<u64>,
    max_steps: u64,
    work_spent: Cell<bool>,
}

impl MemoryState {
    /// Accounting for a heap of at most `limit` bytes, everything included, and a work
    /// budget of `max_steps` steps.
    pub(crate) fn new(limit: usize, max_steps: u64) -> Self {
        MemoryState {
            used: Cell::new(0),
            limit: Cell::new(limit),
            refused: Cell::new(false),
            steps: Cell::new(0),
            churn: Cell::new(0),
            visits: Cell::new(0),
            max_steps,
            work_spent: Cell::new(false),
        }
    }

    /// Counts one interrupt-handler call; false once the work budget is spent.
    pub(crate) fn step(&self) -> bool {
        self.steps.set(self.steps.get().saturating_add(1));
        self.check_work()
    }

    /// Whether the work budget (steps plus allocation) is spent.
    pub(crate) fn work_spent(&self) -> bool {
        self.work_spent.get()
    }

    /// Charges `bytes` of admitted allocation; false (and refuse) once the work budget is
    /// spent. Refused requests cost nothing, so running out of memory stays out of memory.
    fn charge(&self, bytes: usize) -> bool {
        self.churn
            .set(self.churn.get().saturating_add(bytes as u64));
        self.check_work()
    }

    /// Charges `visits` element visits of a scanning built-in before it runs; false once the
    /// work budget is spent, and then the built-in must not run.
    pub(crate) fn charge_visits(&self, visits: u64) -> bool {
        self.visits.set(self.visits.get().saturating_add(visits));
        self.check_work()
    }

    fn check_work(&self) -> bool {
        let work = self
            .steps
            .get()
            .saturating_add(self.churn.get() / BYTES_PER_STEP)
            .saturating_add(self.visits.get() / VISITS_PER_STEP);
        if work > self.max_steps {
            self.work_spent.set(true);
        }
        !self.work_spent.get()
    }

    /// Whether an allocation has been refused for lack of memory.
    pub(crate) fn refused(&self) -> bool {
        self.refused.get()
    }

    /// Whether `extra` more bytes fit; records a refusal if not.
    fn admit(&self, extra: usize) -> bool {
        let fits = self
            .used
            .get()
            .checked_add(extra)
            .is_some_and(|total| total <= self.limit.get());
        if !fits {
            self.refused.set(true);
        }
        fits
    }
}

/// Rust's global allocator (via [`RustAllocator`]) under [`MemoryState`]'s limit.
pub(crate) struct LimitedAllocator {
    state: Rc<MemoryState>,
}

impl LimitedAllocator {
    pub(crate) fn new(state: Rc<MemoryState>) -> Self {
        LimitedAllocator { state }
    }

    fn allocated(&self, ptr: *mut u8) -> *mut u8 {
        if ptr.is_null() {
            self.state.refused.set(true);
        } else {
            // SAFETY: `ptr` was just returned by `RustAllocator`.
            let size = unsafe { RustAllocator::usable_size(ptr) };
            self.state
                .used
                .set(self.state.used.get().saturating_add(size));
        }
        ptr
    }
}

// SAFETY: every pointer comes from `RustAllocator`, which upholds the trait's contract; this
// wrapper only refuses requests (returning null) and counts.
unsafe impl Allocator for LimitedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.state.admit(size) || !self.state.charge(size) {
            return ptr::null_mut();
        }
        let ptr = RustAllocator.alloc(size);
        self.allocated(ptr)
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        // `RustAllocator::calloc` panics on overflow; refuse it here instead.
        let Some(total) = count.checked_mul(size) else {
            self.state.refused.set(true);
            return ptr::null_mut();
        };
        if total == 0 || !self.state.admit(total) || !self.state.charge(total) {
            return ptr::null_mut();
        }
        let ptr = RustAllocator.calloc(1, total);
        self.allocated(ptr)
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: the caller passes a pointer from this allocator, so from `RustAllocator`.
        unsafe {
            let size = RustAllocator::usable_size(ptr);
            self.state
                .used
                .set(self.state.used.get().saturating_sub(size));
            RustAllocator.dealloc(ptr);
        }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        if new_size == 0 {
            // Like libc: free and return null.
            // SAFETY: as in `dealloc`.
            unsafe { self.dealloc(ptr) };
            return ptr::null_mut();
        }
        // SAFETY: the caller passes a pointer from this allocator, so from `RustAllocator`.
        let old_size = unsafe { RustAllocator::usable_size(ptr) };
        if new_size > old_size
            && (!self.state.admit(new_size - old_size) || !self.state.charge(new_size - old_size))
        {
            return ptr::null_mut();
        }
        // SAFETY: as above; on failure the old block stays valid and counted.
        let new_ptr = unsafe { RustAllocator.realloc(ptr, new_size) };
        if new_ptr.is_null() {
            self.state.refused.set(true);
            return new_ptr;
        }
        // SAFETY: `new_ptr` was just returned by `RustAllocator`.
        let new_usable = unsafe { RustAllocator::usable_size(new_ptr) };
        let used = self.state.used.get().saturating_sub(old_size);
        self.state.used.set(used.saturating_add(new_usable));
        new_ptr
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize
    where
        Self: Sized,
    {
        // SAFETY: the caller passes a pointer from this allocator, so from `RustAllocator`.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}

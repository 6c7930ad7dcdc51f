// The overview's live refresh asks this before each poll: a person typing a reason, with a form open or a
// value half-entered, must not lose it to the next refresh. The refresh resumes once the form is left empty.
window.faultline = {
  idle(region) {
    if (region.querySelector("form:focus-within, details[open]")) return false;
    for (const field of region.querySelectorAll("input:not([type=hidden]), textarea")) {
      if (field.value) return false;
    }
    return true;
  },
};

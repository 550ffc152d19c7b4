"""What runs first in every isolated frame (`frames`): the network that CSP does not govern, taken away.

The frame's Content-Security-Policy (`frames.CSP`) gives its scripts no fetch, no image, no
socket. It does not govern WebRTC: a script can open an `RTCPeerConnection` with a STUN
server of its choosing, and the reader's browser then sends UDP packets there (a way out for
the data a sandbox without network holds). No browser offers a policy for it: Chromium 156
ignores CSP's `webrtc 'block'` (it is in `frames.CSP` anyway, for browsers that honour it,
and is inherited by nested documents) and no Permissions-Policy feature covers a peer
connection. So the frame's own first script, before any byte of the sandbox's runs:

- deletes every `RTC*` interface (`RTCPeerConnection`, `webkitRTCPeerConnection`,
  `RTCDataChannel`, …) from the frame's global object. No copy of them is kept anywhere, so
  the sandbox's scripts cannot get them back in this realm;
- removes every nested frame (`iframe`, `frame`, `object`, `embed`, `fencedframe`) as soon as
  it enters the document or a shadow root: a nested document is a fresh realm that still has
  `RTCPeerConnection`, and a `srcdoc` one runs its own scripts. (An `about:blank` child is
  harmless: the frame's sandbox gives it a new opaque origin, so the parent cannot reach
  into it.) The removal runs as a mutation observer, which the browser calls before the
  nested document can load; the functions it uses are kept from before the sandbox's code ran,
  so redefining `remove`, `matches` or `NodeList.length` does not blind it;
- closes the roads to shadow roots the observer would not see: `attachShadow` is wrapped to
  observe each new root, `setHTMLUnsafe`/`parseHTMLUnsafe` are deleted and `document.write`
  throws (they can make a closed declarative shadow root), and `frames.document` rewrites
  the `shadowroot…` attributes of the sandbox's markup so the parser makes none.

What remains is written in docs/security.md ("Outputs: the kernel is the trust boundary"): the frame
may still navigate *itself* to a new document (a `<meta http-equiv="refresh">`, `location`),
which carries neither this prelude nor, for a web address, the frame's policy.
"""

from __future__ import annotations

import re

# Elements that make a nested browsing context (a fresh realm).
NESTED_FRAMES = "iframe,frame,object,embed,fencedframe,portal"

PRELUDE = """
(function () {
  var w = window, names = Object.getOwnPropertyNames(w);
  for (var i = 0; i < names.length; i++) {
    if (/^(webkit|moz)?RTC/.test(names[i])) { try { delete w[names[i]]; } catch (e) {} }
  }
  var apply = Reflect.apply, qsa = Element.prototype.querySelectorAll, remove = Element.prototype.remove;
  var matches = Element.prototype.matches, attach = Element.prototype.attachShadow;
  var getter = function (proto, name) { return Object.getOwnPropertyDescriptor(proto, name).get; };
  var addedNodes = getter(MutationRecord.prototype, 'addedNodes'), nodeType = getter(Node.prototype, 'nodeType');
  var listLength = getter(NodeList.prototype, 'length'), listItem = NodeList.prototype.item;
  var observe = MutationObserver.prototype.observe, watched = {childList: true, subtree: true};
  function sweep(node) {
    if (apply(nodeType, node, []) !== 1) { return; }
    if (apply(matches, node, ['NESTED'])) { apply(remove, node, []); return; }
    var inner = apply(qsa, node, ['NESTED']), n = apply(listLength, inner, []);
    for (var i = 0; i < n; i++) { apply(remove, apply(listItem, inner, [i]), []); }
  }
  var observer = new MutationObserver(function (records) {
    for (var i = 0; i < records.length; i++) {
      var nodes = apply(addedNodes, records[i], []), n = apply(listLength, nodes, []);
      for (var j = 0; j < n; j++) { try { sweep(apply(listItem, nodes, [j])); } catch (e) {} }
    }
  });
  apply(observe, observer, [document, watched]);
  Element.prototype.attachShadow = function () {
    var root = apply(attach, this, arguments);
    apply(observe, observer, [root, watched]);
    return root;
  };
  var parsers = [Element.prototype, ShadowRoot.prototype, Document];
  for (var k = 0; k < parsers.length; k++) { delete parsers[k].setHTMLUnsafe; delete parsers[k].parseHTMLUnsafe; }
  Document.prototype.write = Document.prototype.writeln = function () {
    throw new Error('document.write is not available in a sandbox output frame');
  };
})();
""".replace("NESTED", NESTED_FRAMES)

# The parser makes a declarative shadow root from `shadowrootmode` (and its sibling attributes):
# a closed one is out of the observer's reach. An attribute name holds no character reference,
# so this literal, case-blind match finds every one the parser would read.
_SHADOW_ROOT_ATTRIBUTE = re.compile("shadowroot", re.IGNORECASE)


def without_declarative_shadow_roots(markup: str) -> str:
    """`markup` with every ``shadowroot…`` attribute renamed, so the parser makes no shadow root."""
    return _SHADOW_ROOT_ATTRIBUTE.sub("data-no-shadow-root", markup)

// A layering fixture: diag/ including elastic/, the layer before it, which
// is allowed (format.layering_refuses checks it is not named).
#pragma once

#include "brigade/elastic/agent.h"

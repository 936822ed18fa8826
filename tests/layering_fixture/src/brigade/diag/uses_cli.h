// A layering fixture: diag/ reaching down to cli/, which
// check_layering.cmake must refuse (format.layering_refuses).
#pragma once

#include "brigade/cli/commands.h"
#include "brigade/elastic/agent.h"

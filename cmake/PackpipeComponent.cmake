# packpipe_add_component(<name> [DEPENDS <component>...] [PRIVATE <target>...] [SOURCES <file>...])
#
# One static library per component, packpipe_<name> with the alias packpipe::<name>, from
# <name>/*.cpp (or SOURCES). Layering is the build's, not a convention:
#  - a component may depend only on components declared before it (a later one is a configure
#    error), so the order of add_subdirectory() calls is the layer order;
#  - each component's headers are visible to other targets only through a directory of its own,
#    build/include/<name>/<name> -> <name>/, which is a PUBLIC include directory of packpipe_<name>
#    alone. A target sees "<name>/x.h" only if it links the component, so an upward include (a
#    lower layer including a higher one) fails to compile.
# The dependency closure of every component is written to build/layers.txt for the include scan
# test (tests/cmake/test_layering.sh), which also catches headers no translation unit includes.
include(GNUInstallDirs)  # CMAKE_INSTALL_INCLUDEDIR below, CMAKE_INSTALL_BINDIR in cli/

function(packpipe_add_component name)
  cmake_parse_arguments(A "" "" "DEPENDS;PRIVATE;SOURCES" ${ARGN})
  if(A_SOURCES)
    set(_src ${A_SOURCES})
  else()
    file(GLOB _src CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${name}/*.cpp)
  endif()
  set(_t packpipe_${name})
  add_library(${_t} STATIC ${_src})
  add_library(packpipe::${name} ALIAS ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${name})  # installed as packpipe::<name> too
  set(_inc ${PROJECT_BINARY_DIR}/include/${name})
  file(MAKE_DIRECTORY ${_inc})
  if(NOT IS_SYMLINK ${_inc}/${name})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${name} ${_inc}/${name} SYMBOLIC)
  endif()
  target_include_directories(${_t} PUBLIC $<BUILD_INTERFACE:${_inc}>
                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/packpipe>)
  get_property(_declared GLOBAL PROPERTY PACKPIPE_COMPONENTS)
  set(_closure "")
  foreach(_d ${A_DEPENDS})
    if(NOT _d IN_LIST _declared)
      message(FATAL_ERROR "component '${name}' depends on '${_d}', which is not declared before it: the layer "
                          "order is the order of the components in the top-level CMakeLists.txt")
    endif()
    target_link_libraries(${_t} PUBLIC packpipe::${_d})
    get_property(_dc GLOBAL PROPERTY PACKPIPE_CLOSURE_${_d})
    list(APPEND _closure ${_d} ${_dc})
  endforeach()
  list(REMOVE_DUPLICATES _closure)
  # packpipe's warning flags (C++ sources) as compile options of the component only: linking
  # packpipe_warnings, even PRIVATE, would put it in the exported link interface of a static library.
  target_compile_options(${_t} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:$<TARGET_PROPERTY:packpipe_warnings,INTERFACE_COMPILE_OPTIONS>>)
  target_link_libraries(${_t} PRIVATE ${A_PRIVATE})
  set_property(GLOBAL APPEND PROPERTY PACKPIPE_COMPONENTS ${name})
  set_property(GLOBAL PROPERTY PACKPIPE_CLOSURE_${name} ${_closure})
  string(REPLACE ";" " " _cl "${_closure}")
  file(APPEND ${PROJECT_BINARY_DIR}/layers.txt.in "${name}: ${_cl}\n")
endfunction()
